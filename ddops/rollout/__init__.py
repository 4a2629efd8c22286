"""Safe changes beyond one deploy, one subpackage per feature:

shadow/  a candidate beside production: replay prompts to both, judge, promote or abort;
switch/  one single-GPU host from one profile to another, sequentially;
fleet/   a plan over many hosts: canary, waves, bake with metric checks, halt and revert.

Shared by the three: `host_changes` (what a rollout does to one host, through ddops.deploy's
public entry points), `output` (the human/json/events channels and consent) and `records`
(files this machine keeps). Imports nothing of serving.
"""
