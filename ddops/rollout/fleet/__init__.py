"""Fleet rollouts: `waves` (pure: plan file, wave order, resumable state), `loop` (canary then
waves in parallel, halt and revert), `hosts` (the loop wired to real hosts), `bake` + `scrape` +
`bake_checks` (metric checks while a wave bakes), `notify` (webhooks), `run_plan` (the whole
`ddops rollout PLAN.yaml` run with its live view), `tables`, `bench` (the fleet figure)."""
