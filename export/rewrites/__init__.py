"""Export-hostile operations that several families share, and their graph-friendly replacements,
each a module swap (polyphase_conv_transpose.py: an ONNX graph rewrite) checked against a reference
computation:

* adain.py: AdaIN by InstanceNorm vs mean/variance over time then per-sample scale and shift;
* rvq.py: residual vector quantization by cdist/argmin vs MatMul + ArgMin + Gather unrolled over stages;
* polyphase_conv_transpose.py: a 1-D ConvTranspose in an ONNX graph as a polyphase Conv + Reshape/
  Transpose/Slice (same function), so INT8 CPU kernels can run the upsampling convs.

A family's own rewrites live beside it (models/<family>/rewrites/). Random draws need no rewrite:
a family takes its noise as inputs (models/sampling.py).
"""
