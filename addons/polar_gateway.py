"""mitmproxy entry script: `mitmdump -s addons/polar_gateway.py --set polar_upstream=http://VLLM_HOST:8000`.

Thin on purpose: all behaviour lives in `polar.mitm.addon.PolarAddon`, which `polar proxy` also runs.
"""

from polar.mitm.addon import PolarAddon

addons = [PolarAddon()]
