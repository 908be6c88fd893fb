"""NeMo Gym's entrypoint for polar's agent: the server itself is polar.adapters.nemo_gym.PolarAgent."""

from polar.adapters.nemo_gym import PolarAgent

if __name__ == "__main__":
    PolarAgent.run_webserver()
