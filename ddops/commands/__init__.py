"""Command groups of the CLI, in the order `ddops --help` lists them."""

from ddops.commands import deploy, fit, lab, operate, preflight, profiles, report, rollout

COMMAND_MODULES = [profiles, fit, preflight, lab, deploy, operate, rollout, report]
