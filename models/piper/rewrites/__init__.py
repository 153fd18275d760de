"""Piper's export-hostile operations and their graph-friendly replacements (export/rewrites/ holds
the ones other families share): each a module swap checked against the original computation.

* alignment.py: duration -> alignment by scatter (the training code's shape) vs cumulative sums;
* spline.py: the rational-quadratic spline by searchsorted/gather-free elementwise ops.
"""
