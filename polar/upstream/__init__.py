"""The upstream vLLM server: its chat endpoint (vLLM renders the template) and its token-in endpoints
(polar renders, vLLM samples), behind one Backend protocol (base.py)."""
