"""rl/: training on the worlds. Today: the group advantages and adaptive rollout counts
(``rl/advantages.py``); the verl integration comes with the rl issue."""
