"""The rollout service: tasks in, scored trajectories out, asynchronously, on one machine or many.

    tasks.py       what a trainer submits (TaskSpec) and drains (SessionResult)
    state.py       SQLite state that survives a restart
    node.py        a gateway node: INIT → READY buffer → RUNNING → POSTRUN pools
    session.py     what the pools do with a real session (sandbox, harness, capture, reward);
                   harnesses come from polar.harnesses (the CLIs, shell, python-agent)
    swe_image.py   the image layer with git, python3 and pytest that container sessions run in
    evaluators.py  rewards: completed, test_output, swe, script_reward, module:attribute
    service.py     dispatch to nodes, persist results, pause/resume, policy versions
    server.py      the HTTP API; client.py its client
    ray_nodes.py   nodes as Ray actors, one per machine
    simulate.py    stand-in sessions for the benchmark and scheduling tests
"""
