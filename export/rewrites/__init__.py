"""Export-hostile operations that several families share, and their graph-friendly replacements,
each a module swap checked against a reference computation:

* adain.py: AdaIN by InstanceNorm vs mean/variance over time then per-sample scale and shift;
* rvq.py: residual vector quantization by cdist/argmin vs MatMul + ArgMin + Gather unrolled over stages.

A family's own rewrites live beside it (models/<family>/rewrites/). Random draws need no rewrite:
a family takes its noise as inputs (models/sampling.py).
"""
