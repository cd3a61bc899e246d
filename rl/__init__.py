"""rl/: training agents on the worlds with verl (docs/guides/training.md).

``contract`` is what the parts share; ``world`` acts on instances and grades them (no
verl); ``verl_loop`` is verl's agent loop over them and ``verl_manager`` its adaptive
rollouts; ``loss`` registers WildAWM's advantage and loss with verl; ``rewards``,
``samples``, ``scheduler`` and ``advantages`` are the papers' arithmetic; ``dataset``,
``sft`` and ``config`` write what a training run reads. verl and torch are imported only
in this package.
"""
