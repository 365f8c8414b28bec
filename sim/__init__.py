"""The emulated host: tenants replay traces or generated workloads through
the real policy runtime on a virtual clock (backend.py).  It speaks the
node backend interface (agent/backend.py) and the protocol's types, so the
agent's node client drives it like a real host, while the controller's
planner and `cachepilot run` use it without importing the agent."""
