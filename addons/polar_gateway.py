"""mitmproxy entry script: `mitmdump -s addons/polar_gateway.py --set polar_upstream=http://VLLM_HOST:8000`.

Thin on purpose: polar's addons (`polar.mitm.chain.polar_addons`) are the ones `polar proxy` also runs.
"""

from polar.mitm.chain import polar_addons

addons = polar_addons()
