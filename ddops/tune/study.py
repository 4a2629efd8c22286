"""The search: an Optuna study in SQLite, one trial per candidate measured on the host.

- grid: every runnable candidate, in the space's order, each enqueued once.
- model: Optuna's TPE sampler over the space's keys (a key its method cannot use is not
  asked), so later candidates are drawn near the best so far.
- Early stop: a candidate whose first concurrency level is already clearly worse than the best
  one's first level (below PRUNE_BELOW of it) is stopped there (ClearlyWorse, an Optuna pruner).
- Resumable: the study lives in $DDOPS_STATE/tune/studies.db under a name made of the profile,
  host, space, load and objective; a rerun loads it, marks the trial a killed run left running
  as failed, and measures only what is left. The production reference is measured afresh.

Each trial's figures are its user attributes (the result table reads them back), its value the
objective as a multiple of production's: 0 when it did not start, or failed a requirement.
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass

import optuna
from optuna.trial import TrialState

from ddops.deploy import Holder
from ddops.rollout import host_changes
from ddops.rollout.shadow.compare import Endpoint
from ddops.rollout.shadow.lifecycle import api_key_of, production_of
from ddops.tune import space as spaces
from ddops.tune.measure import Level, geomean, ratio, run_level
from ddops.tune.plan import Candidate, Plan

PRUNE_BELOW = 0.8
SEED = 0
optuna.logging.set_verbosity(optuna.logging.WARNING)


class ClearlyWorse(optuna.pruners.BasePruner):
    """Prune at the first level when below PRUNE_BELOW of the best finished trial's first level."""

    def prune(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> bool:
        first = trial.intermediate_values.get(0)
        if first is None:
            return False
        best = [t.intermediate_values.get(0) for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
                if t.value and t.value > 0 and t.intermediate_values.get(0)]
        return bool(best) and first < PRUNE_BELOW * max(best)


def storage_url(plan: Plan) -> str:
    plan.folder.parent.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{plan.folder.parent / 'studies.db'}"


def open_study(plan: Plan) -> optuna.Study:
    sampler = optuna.samplers.TPESampler(seed=SEED, n_startup_trials=3, multivariate=True, group=True) \
        if plan.search == "model" else optuna.samplers.RandomSampler(seed=SEED)
    study = optuna.create_study(study_name=plan.study, storage=storage_url(plan), direction="maximize",
                                sampler=sampler, pruner=ClearlyWorse(), load_if_exists=True)
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING, TrialState.WAITING)):
        study._storage.set_trial_state_values(t._trial_id, TrialState.FAIL)   # a killed run's
    return study


def measured(study: optuna.Study) -> dict[str, optuna.trial.FrozenTrial]:
    """Candidate id -> its finished measurement (complete or pruned after measuring)."""
    done = {}
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)):
        if "levels" in t.user_attrs or "failed" in t.user_attrs:
            done.setdefault(t.user_attrs["candidate"], t)
    return done


@dataclass
class Reference:
    """Production measured at each level: the yardstick and the answers candidates must match."""
    levels: list[Level]
    samples: dict[int, list]

    def level(self, concurrency: int) -> Level:
        return next(lv for lv in self.levels if lv.concurrency == concurrency)


def measure_production(plan: Plan, url: str) -> Reference:
    endpoint = Endpoint("production", url, api_key=api_key_of(plan.base))
    levels, samples = [], {}
    for c in plan.load.levels:
        level, got, _ = run_level(endpoint, plan.load, c)
        levels.append(level)
        samples[c] = got
    return Reference(levels, samples)


@contextmanager
def renewing(connect, host: str):
    """Touch the lease every RENEW_S on a connection of its own until the block ends."""
    from ddops.deploy import lease
    stop = threading.Event()

    def loop():
        with connect(host) as remote:
            while not stop.wait(lease.RENEW_S):
                lease.renew(remote)

    thread = threading.Thread(target=loop, name="tune-lease", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=30)


class Runner:
    """Runs trials: each candidate deployed as the tune unit (gated), measured, removed."""

    def __init__(self, plan: Plan, remote, reference: Reference, progress):
        self.plan, self.remote, self.reference, self.progress = plan, remote, reference, progress
        self.by_id = {c.id: c for c in plan.candidates}
        self.started = 0            # candidates started in this run

    def suggest(self, trial: optuna.Trial) -> dict:
        if self.plan.search == "grid":
            cid = trial.suggest_categorical("candidate", [c.id for c in self.plan.runnable])
            return self.by_id[cid].overrides
        chosen, base = {}, self.plan.base
        method = spaces.method_of({}, base)          # the method is the first key when searched
        for key, values in self.plan.space.keys.items():
            if not spaces.applies(key, method, base.runtime):
                continue                             # not asked: it means nothing for this method
            chosen[key] = trial.suggest_categorical(key, list(values))
            if key == spaces.METHOD_KEY:
                method = spaces.method_of(chosen, base)
        return spaces.effective(chosen, base)

    def __call__(self, trial: optuna.Trial) -> float:
        overrides = self.suggest(trial)
        cid = spaces.candidate_id(overrides)
        candidate = self.by_id.get(cid) or Candidate(cid, overrides, spaces.label(overrides), None,
                                                     skipped="not in the space's candidates")
        trial.set_user_attr("candidate", cid)
        trial.set_user_attr("label", candidate.label)
        if candidate.skipped:
            trial.set_user_attr("skipped", candidate.skipped)
            raise optuna.TrialPruned()
        earlier = measured(trial.study).get(cid)
        if earlier is not None:                     # the sampler drew it again: its figures stand
            trial.set_user_attr("repeat_of", earlier.number)
            if earlier.state == TrialState.PRUNED:
                raise optuna.TrialPruned()
            return earlier.value or 0.0
        return self.run(trial, candidate)

    def run(self, trial: optuna.Trial, candidate: Candidate) -> float:
        from ddops.deploy import lease
        plan, remote = self.plan, self.remote
        self.started += 1
        self.progress("candidate", f"{candidate.label}: start as {plan.unit} on {plan.host}:{plan.port}")
        began = time.monotonic()
        lease.bind(remote, plan.unit)
        try:
            deployed = host_changes.deploy(remote, candidate.target, f"ddops tune {plan.base.name} ({candidate.label})",
                                           self.progress)
            if deployed.code != 0:
                trial.set_user_attr("failed", f"{deployed.result}: {deployed.message}")
                self.progress("candidate", f"{candidate.label}: did not start ({deployed.result})")
                return 0.0
            return self.measure(trial, candidate)
        finally:
            lease.remove_candidate(remote, plan.unit)
            trial.set_user_attr("wall_s", round(time.monotonic() - began, 1))

    def measure(self, trial: optuna.Trial, candidate: Candidate) -> float:
        plan = self.plan
        levels, ratios, accept = [], [], None
        with host_changes.dialable(self.remote.host, candidate.target.spec.base_url) as url:
            endpoint = Endpoint("candidate", url, api_key=api_key_of(plan.base))
            for step, c in enumerate(plan.load.levels):
                level, _, accept = run_level(endpoint, plan.load, c, self.reference.samples[c])
                levels.append(level)
                ratios.append(ratio(level, self.reference.level(c), plan.objective))
                trial.set_user_attr("levels", [lv.to_dict() for lv in levels])
                trial.set_user_attr("accept_length", accept)
                self.progress("candidate", f"{candidate.label}: concurrency {c}: "
                              f"{_figure(level)}, {ratios[-1] or 0:.2f}x production")
                if step == 0 and len(plan.load.levels) > 1:
                    trial.report(ratios[-1] or 0.0, 0)
                    if trial.should_prune():
                        trial.set_user_attr("pruned", f"first level {ratios[-1] or 0:.2f}x production, "
                                                      f"below {PRUNE_BELOW} of the best's")
                        raise optuna.TrialPruned()
        unmet = plan.requirements.unmet(levels)
        value = geomean(ratios)
        trial.set_user_attr("objective", value)
        if unmet:
            trial.set_user_attr("unmet", unmet)
            return 0.0
        return value


def _figure(level: Level) -> str:
    tps = f"{level.tokens_per_s:.1f} tok/s" if level.tokens_per_s else "no tokens"
    itl = f", ITL p50 {level.itl_p50_s * 1000:.0f} ms" if level.itl_p50_s else ""
    return tps + itl


@dataclass
class Ran:
    study: optuna.Study
    reference: Reference
    notes: list[str]          # what a dead tuner left, ended before this one began
    measured_before: int      # candidates an earlier run of this study had measured
    started: int              # candidates this run started


def run(plan: Plan, connect, progress) -> Ran:
    """Take the host's tune lease, measure production, run trials until the plan's trials are
    measured, the budget is spent or the space is exhausted; every candidate is removed and
    the lease released on the way out, whatever ends it."""
    from ddops.deploy import lease
    study = open_study(plan)
    before = len([c for c in plan.runnable if c.id in measured(study)])
    notes: list[str] = []
    with connect(plan.host) as remote:
        notes += lease.take(remote, Holder.here(f"ddops tune {plan.base.name} --host {plan.host}"))
        try:
            with renewing(connect, plan.host):
                prod = production_of(remote, plan.production_unit)
                progress("production", f"measuring {plan.production_unit} at concurrency "
                                       f"{', '.join(map(str, plan.load.levels))} (the yardstick)")
                with host_changes.dialable(remote.host, prod.url) as url:
                    reference = measure_production(plan, url)
                runner = Runner(plan, remote, reference, progress)
                _optimize(study, plan, runner)
        finally:
            lease.release(remote)
    return Ran(study, reference, notes, before, runner.started)


def _optimize(study: optuna.Study, plan: Plan, runner: Runner) -> None:
    done = measured(study)
    left = [c for c in plan.runnable if c.id not in done]
    wanted = max(0, plan.trials - len([c for c in plan.runnable if c.id in done]))
    if not left or not wanted:
        return
    if plan.search == "grid":
        for c in left[:wanted]:
            study.enqueue_trial({"candidate": c.id}, skip_if_exists=False)
    deadline = time.monotonic() + plan.budget_s
    cap = 20 * wanted + len(plan.candidates)     # the sampler may draw skipped or repeated ones

    def enough(study_: optuna.Study, _trial) -> None:
        now_measured = len([c for c in plan.runnable if c.id in measured(study_)])
        if (now_measured >= plan.trials or runner.started >= wanted or time.monotonic() > deadline
                or len(study_.trials) >= cap or now_measured >= len(plan.runnable)):
            study_.stop()

    study.optimize(runner, n_trials=len(left[:wanted]) if plan.search == "grid" else cap,
                   callbacks=[enough], catch=())
