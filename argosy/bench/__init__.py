"""`argosy bench`: a load tester for any OpenAI-compatible server.

Modules, one concern each:
  workload.py        what to send: length distributions, synthetic prompts, shared prefixes, sessions, traces
  arrivals.py        when to send it: Poisson / gamma arrivals, ramps, trace timestamps
  client.py          one streaming request over aiohttp, timed per chunk, errors classified
  runner.py          open loop (on schedule) and closed loop (N workers), progress line, send lag
  metrics.py         TTFT / TPOT / ITL / E2EL, throughput, goodput (vLLM's definitions), SLOs
  results.py         the JSON file (config, per-request records, summaries) and the text summary
  svg.py, html_report.py   the self-contained HTML report with inline SVG charts
  fixture_server.py  an OpenAI-shaped streaming server with configured delays (tests, comparisons)
  cli.py             `argosy bench` arguments and entry point
"""
