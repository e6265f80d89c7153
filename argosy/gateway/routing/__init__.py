"""Routing as filters, scorers and a picker (the shape of llm-d's inference scheduler).

For each request the Router (argosy/gateway/router.py) runs, over one pool of upstreams:
  filters.py   drop upstreams that may not take it: live and not ejected, not yet tried for this request,
               its length class (later: region, residency, revision: one more filter each)
  scorers.py   each scorer gives every remaining upstream a score in [0, 1] and declares what it needs
               (replica gauges, the prompt, a session key)
  picker.py    the highest weighted sum wins, ties rotating; the prefix balance gate drops affinity
               scores of upstreams far busier than the idlest
  presets.py   each `routing.policy` name is a preset of scorer weights; `routing.scorers` gives weights
  request.py   RouteRequest: what a scorer may read of the request

This package imports nothing from argosy but its own modules and gateway/prefix_index.py, so the fleet
file's model (argosy/config.py) can take its names from here without an import circle.
"""
