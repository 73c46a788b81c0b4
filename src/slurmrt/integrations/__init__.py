"""slurmrt inside the trainers people use: :mod:`~slurmrt.integrations.transformers` (the Hugging Face ``Trainer``)
and :mod:`~slurmrt.integrations.lightning` (Lightning's ``Trainer``). Each module imports its framework, which is an
optional extra (``slurmrt[transformers]``, ``slurmrt[lightning]``); ``import slurmrt`` imports neither."""
