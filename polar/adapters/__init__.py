"""Adapters that let RL frameworks consume polar's rollout service in their own terms.

    nemo_gym.py      a NeMo Gym responses-API agent: POST /run → a polar task → its scored trajectory
    rollout_link.py  the asynchronous link to the rollout service's HTTP API that adapters share

Each framework's adapter imports that framework itself, so it runs in the framework's environment
(scripts/setup_nemo_gym.sh for NeMo Gym); nothing here is imported by polar's own modules.
"""
