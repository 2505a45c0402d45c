"""Training one agent so that a night survives crashes, kills, out-of-memory and Ctrl+C.

- ``agents``: SB3 models from the config (hyperparameters, parallel environments, rollouts).
- ``trainer``: ``StageTrainer``, the loop: fresh or resumed model, learn, recover, checkpoint.
- ``state``: ``TrainingState``, what a checkpoint records besides the model (typed, round-trips).
- ``guard``: the callback that checkpoints at rollout boundaries and says why training stopped.
- ``recovery``: failure types, the non-finite check and the batch-size back-off policy.
- ``memory``: memory figures and out-of-memory predicates.
- ``callbacks``: progress and the learning curve's evaluations.
- ``fast_sac``: SAC learning while its environment worker steps.
- ``imitation``: the warm start that imitates the optimum's dispatch.
"""
