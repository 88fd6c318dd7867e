"""The user's own training script as a trainfit job: ``trainfit plan|tune -- python train.py``.

The script runs unchanged with hooks injected through ``sitecustomize`` (the doctor's mechanism,
:mod:`trainfit.doctor.inject`) until its ``Trainer`` / ``SFTTrainer`` would start training
(:mod:`~trainfit.script.hooks`, inside the user's process). ``plan`` loads the model on the meta
device from its configuration only; ``tune`` keeps the real model and probes it. What the trainer
holds is read (:mod:`~trainfit.script.read`), mapped to a :class:`~trainfit.job.JobSpec`
(:mod:`~trainfit.script.mapping`), planned or tuned with trainfit's own grid and search, and the
answer is said in the script's terms: the ``TrainingArguments`` / ``SFTConfig`` keywords to change
(:mod:`~trainfit.script.diff`).

Kept free of imports here: the hooks are imported inside the user's process.
"""
