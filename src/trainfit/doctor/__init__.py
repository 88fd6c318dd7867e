"""``trainfit doctor``: measure where a training step's time goes, name the bottleneck, fix it.

Kept free of imports: :mod:`trainfit.doctor.hooks` is imported inside the user's own process (via
``sitecustomize``) and must not pull in trainfit's heavier modules there.
"""
