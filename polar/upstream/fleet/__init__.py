"""A fleet of vLLM replicas serving one model behind one polar: each replica's state (replicas.py), where a
call goes (routing.py), taking failed replicas out and back in (health.py), and the Backend the gateway
drives (backend.py), so the gateway pipeline sees one upstream."""
