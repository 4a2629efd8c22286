"""Safe changes beyond one deploy: shadow comparison, profile switching, fleet rollouts.

Builds on ddops.deploy (apply, gate, revert); imports nothing of serving. Pure cores
(verdict, waves, stats) take data and return data; HTTP and SSH stay in compare/shadow/switch/fleet.
"""
