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

import statistics
import threading
import time
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

import optuna
from optuna.trial import TrialState

from ddops.deploy import Holder
from ddops.rollout import host_changes
from ddops.rollout.shadow.compare import Endpoint
from ddops.rollout.shadow.lifecycle import api_key_of, production_of
from ddops.tune import space as spaces
from ddops.tune.measure import Level, geomean, level_name, mirrored_level, ratio, run_level
from ddops.tune.plan import Candidate, Pace, Plan

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


def _storage(plan: Plan) -> str | None:
    """The studies' SQLite URL when a study was ever kept there (planning creates nothing)."""
    return storage_url(plan) if (plan.folder.parent / "studies.db").exists() else None


def measured_count(plan: Plan) -> int:
    """Runnable candidates this plan's study measured in earlier runs (a rerun measures the rest)."""
    url = _storage(plan)
    if url is None or plan.study not in optuna.get_all_study_names(url):
        return 0
    done = measured(optuna.load_study(study_name=plan.study, storage=url))
    return len([c for c in plan.runnable if c.id in done])


def pace_on(plan: Plan) -> Pace:
    """The host's pace from every study's candidates of the same runtime started on it before:
    the median start (deploy and gate) and the median of each candidate's wall time per
    completion token asked (a vLLM start takes 23-41 s on a lab host, the bundled runtime's 6 s
    with the tiny model: docs/tune.md)."""
    url = _storage(plan)
    if url is None:
        return Pace()
    starts, per_token = [], []
    for name in optuna.get_all_study_names(url):
        for t in optuna.load_study(study_name=name, storage=url).get_trials(deepcopy=False):
            attrs = t.user_attrs
            if (attrs.get("runs_on"), attrs.get("runtime")) != (plan.runs_on, plan.base.runtime) \
                    or "start_s" not in attrs:
                continue
            starts.append(attrs["start_s"])
            if attrs.get("tokens_asked"):
                per_token.append(attrs["measure_s"] / attrs["tokens_asked"])
    if not starts:
        return Pace()
    token_s = statistics.median(per_token) if per_token else Pace.token_s
    return Pace(statistics.median(starts), token_s, len(starts), plan.runs_on, plan.base.runtime)


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
    failed: str | None = None       # mirrored: why the base's own yardstick did not start

    def level(self, concurrency: int) -> Level:
        return next(lv for lv in self.levels if lv.concurrency == concurrency)


def measure_production(plan: Plan, endpoint: Endpoint) -> Reference:
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
    """Runs trials: each candidate deployed as the tune unit (gated), measured, removed.
    `production`: production's endpoint, dialable here, whose tap a mirrored load points."""

    def __init__(self, plan: Plan, remote, reference: Reference | None, progress, production: Endpoint | None = None):
        self.plan, self.remote, self.reference, self.progress = plan, remote, reference, progress
        self.production = production
        self.by_id = {c.id: c for c in plan.candidates}
        self.started = 0            # candidates started in this run

    @contextmanager
    def deployed(self, candidate: Candidate):
        """The candidate as the tune unit, bound to the lease, gated; removed on the way out,
        whatever ends the block. Yields the deploy's result."""
        from ddops.deploy import lease
        plan, remote = self.plan, self.remote
        self.progress("candidate", f"{candidate.label}: start as {plan.unit} on {plan.runs_on}:{plan.port}")
        lease.bind(remote, plan.unit)
        try:
            yield host_changes.deploy(remote, candidate.target, f"ddops tune {plan.base.name} ({candidate.label})",
                                      self.progress)
        finally:
            lease.remove_candidate(remote, plan.unit)

    def on_mirrored(self, candidate: Candidate, endpoint: Endpoint) -> tuple[Level, float | None]:
        """Production's tap pointed at the candidate until it answered the load's count of
        production's requests, or the wait ran out; the tap is turned off whatever happens."""
        from ddops.rollout.shadow import mirrored
        load = self.plan.load
        mirrored.start_tap(self.production, candidate.target.spec.base_url, api_key_of(self.plan.base), 0.0)
        try:
            deadline = time.monotonic() + load.wait_s
            while (stats := mirrored.sink_of(endpoint))["compared"] < load.count and time.monotonic() < deadline:
                time.sleep(1.0)
        finally:
            mirrored.stop_tap(self.production)
        return mirrored_level(stats), stats["shadow"]["accept_length"]

    def yardstick(self) -> Reference:
        """Mirrored: the base profile itself, run as a candidate on the same traffic."""
        base = self.plan.reference
        with self.deployed(base) as done:
            if done.code != 0:
                return Reference([], {}, failed=f"the yardstick, {self.plan.base.name} as {self.plan.unit}, "
                                                f"did not start ({done.result}: {done.message})")
            with host_changes.dialable(self.remote.host, base.target.spec.base_url) as url:
                level, _ = self.on_mirrored(base, Endpoint("yardstick", url, api_key=api_key_of(self.plan.base)))
        self.progress("production", f"{self.plan.base.name} as it is, on {level_name(level.concurrency)}: "
                                    f"{_figure(level)}")
        return Reference([level], {})

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
        self.started += 1
        began = time.monotonic()
        trial.set_user_attr("runs_on", self.plan.runs_on)
        trial.set_user_attr("runtime", self.plan.base.runtime)
        try:
            with self.deployed(candidate) as deployed:
                trial.set_user_attr("start_s", round(time.monotonic() - began, 1))
                if deployed.code != 0:
                    trial.set_user_attr("failed", f"{deployed.result}: {deployed.message}")
                    self.progress("candidate", f"{candidate.label}: did not start ({deployed.result})")
                    return 0.0
                return self.measure(trial, candidate)
        finally:
            trial.set_user_attr("wall_s", round(time.monotonic() - began, 1))

    def measure(self, trial: optuna.Trial, candidate: Candidate) -> float:
        plan = self.plan
        levels, ratios, accept = [], [], None
        began = time.monotonic()
        with host_changes.dialable(self.remote.host, candidate.target.spec.base_url) as url:
            endpoint = Endpoint("candidate", url, api_key=api_key_of(plan.base))
            for step, c in enumerate(plan.load.levels):
                if plan.load.mirrored:
                    level, accept = self.on_mirrored(candidate, endpoint)
                else:
                    level, _, accept = run_level(endpoint, plan.load, c, self.reference.samples[c])
                    trial.set_user_attr("measure_s", round(time.monotonic() - began, 2))
                    trial.set_user_attr("tokens_asked", (step + 1) * len(plan.load.prompts) * plan.load.max_tokens)
                levels.append(level)
                ratios.append(ratio(level, self.reference.level(c), plan.objective))
                trial.set_user_attr("levels", [lv.to_dict() for lv in levels])
                trial.set_user_attr("accept_length", accept)
                self.progress("candidate", f"{candidate.label}: {level_name(c)}: "
                              f"{_figure(level)}, {ratios[-1] or 0:.2f}x {_yardstick(plan)}")
                if step == 0 and len(plan.load.levels) > 1:
                    trial.report(ratios[-1] or 0.0, 0)
                    if trial.should_prune():
                        trial.set_user_attr("pruned", f"first level {ratios[-1] or 0:.2f}x production, "
                                                      f"below {PRUNE_BELOW} of the best's")
                        raise optuna.TrialPruned()
        unmet = plan.requirements.unmet(levels)
        if plan.load.mirrored and levels[0].requests < plan.load.count:
            unmet.append(f"{levels[0].requests} of {plan.load.count} mirrored requests answered within "
                         f"{plan.load.wait_s:.0f} s")
        value = geomean(ratios)
        trial.set_user_attr("objective", value)
        if unmet:
            trial.set_user_attr("unmet", unmet)
            return 0.0
        return value


def _yardstick(plan: Plan) -> str:
    return f"{plan.base.name} as it is" if plan.load.mirrored else "production"


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
    spare = f" --on {plan.spare}" if plan.spare else ""
    with connect(plan.runs_on) as remote:
        notes += lease.take(remote, Holder.here(f"ddops tune {plan.base.name} --host {plan.host}{spare}"))
        try:
            with renewing(connect, plan.runs_on):
                with production_endpoint(plan, connect, remote) as production:
                    runner = Runner(plan, remote, None, progress, production)
                    if plan.load.mirrored:
                        progress("production", f"{plan.production_unit} on {plan.host} copies its requests to "
                                               f"each candidate in turn until it answered {plan.load.count} of them")
                        reference = runner.reference = runner.yardstick()
                    else:
                        progress("production", f"measuring {plan.production_unit} on {plan.host} at concurrency "
                                               f"{', '.join(map(str, plan.load.levels))} (the yardstick)")
                        reference = runner.reference = measure_production(plan, production)
                    if not reference.failed:
                        _optimize(study, plan, runner)
        finally:
            lease.release(remote)
    return Ran(study, reference, notes, before, runner.started)


@contextmanager
def production_endpoint(plan: Plan, connect, remote):
    """Production's endpoint, dialable here for as long as the block runs: the yardstick's, and
    the tap a mirrored load points at each candidate in turn. `remote`: the candidates' host
    (production's, unless a spare)."""
    with ExitStack() as stack:
        production_host = stack.enter_context(connect(plan.host)) if plan.spare else remote
        prod = production_of(production_host, plan.production_unit)
        url = stack.enter_context(host_changes.dialable(production_host.host, prod.url))
        yield Endpoint("production", url, api_key=api_key_of(plan.base))


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
