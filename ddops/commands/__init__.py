"""Command groups of the CLI, in the order `ddops --help` lists them."""

from ddops.commands import (adopt, demo, deploy, fit, hosts, install, lab, monitor, operate, preflight, profiles,
                            report, rollout, tune)

COMMAND_MODULES = [profiles, fit, preflight, lab, install, hosts, deploy, demo, adopt, operate, rollout, tune, monitor, report]
