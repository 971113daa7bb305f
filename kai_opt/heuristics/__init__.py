"""The greedy engine: KAI-like actions (allocate, consolidate, reclaim, preempt, stale-gang) over a Session."""
