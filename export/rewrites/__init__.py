"""Export-hostile operations and their TensorRT-friendly replacements, each a module swap with a reference.

* alignment.py: duration -> alignment by scatter (the training code's shape) vs cumulative sums (ours);
* spline.py: the rational-quadratic spline by searchsorted/gather-free elementwise ops vs a direct reference;
* adain.py: AdaIN by InstanceNorm vs mean/variance over time then per-sample scale and shift;
* rvq.py: residual vector quantization by cdist/argmin vs MatMul + ArgMin + Gather unrolled over stages.

Random draws need no rewrite here: PiperVits takes its noise as inputs (models/interface.py NoiseControl).
"""
