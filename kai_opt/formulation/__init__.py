"""The CP-SAT engine: one model per cycle over the pending work that matters most (a window), deciding jointly
where pods go (bind or pipeline) and which preemptible pods are evicted, with the greedy plan as hint and
fallback. Modules: scope (what the model covers), model (variables and constraints), objective, solve (worker
process under a watchdog), decode (solution -> plan)."""
