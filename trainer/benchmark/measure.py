"""The benchmark's parent: plan the trials, run each in a process of its own, summarise and format.

Pairs run interleaved (plain, product, plain, product...) and the ratio is taken of the medians,
so a noisy machine still gives a fair ratio.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from trainer.base.errors import UsageError
from trainer.base.files import write_json_atomic
from trainer.benchmark.spec import Sizes, Trial, TrialKind
from trainer.config.roster import AGENTS, agent_spec
from trainer.config.sections import Config
from trainer.learn.agents import ENVS_PER_CORE
from trainer.run.device import cpu_cores, resolve_device
from trainer.run.session import site_for
from trainer.site import Site


def _bench_config(cfg: Config, sizes: Sizes) -> Config:
    """The config both sides train with: learning starts early and nothing periodic intervenes."""
    data = cfg.to_dict()
    for agent in AGENTS:
        section = data[agent]
        if agent_spec(agent).off_policy:
            section["learning_starts"] = min(section["learning_starts"], sizes.sac_learning_starts)
            continue
        if sizes.onpolicy_rollout is not None:
            section["n_steps"] = sizes.onpolicy_rollout
            section["n_envs"] = 0
        if "batch_size" in section:  # PPO's minibatch within the rollout
            section["batch_size"] = min(section["batch_size"], section["n_steps"])
    data["schedule"]["curve_every_steps"] = 10**9  # learning-curve evaluations are not training
    data["train"]["keep_best"] = False  # nor is judging the warm start on a validation site built for it
    data["output"]["tensorboard"] = False
    return Config.model_validate(data)


# What every trial imports, both sides alike: a trial forked from a server that has imported these starts in a
# fraction of a second, where a fresh interpreter spends 4-8 s of a 2-core machine on them (the quick benchmark's
# eleven trials: most of its time). The product's own modules are not among them: the plain side never imports them.
TRIAL_PRELOAD = ["torch", "stable_baselines3", "citylearn.citylearn"]


def measure(trial: Trial, config_path: Path, site: Site, device: str, sizes: Sizes) -> dict[str, Any]:
    """Run one trial in a process of its own and return its result (or its error). Where the platform has a
    forkserver (not Windows), the process is forked from one that imported TRIAL_PRELOAD, nothing else run in it;
    otherwise it is a fresh interpreter (``python -m trainer.benchmark.trial SPEC``, its last stdout line the
    result). Either way peak memory and whatever a trial warms up belong to that trial alone."""
    spec = json.dumps({"trial": asdict(trial), "config": str(config_path), "schema": str(site.schema),
                       "device": device, "sizes": asdict(sizes)})
    started = time.perf_counter()
    forked = "forkserver" in multiprocessing.get_all_start_methods()
    result, code, output = _forked(spec) if forked else _interpreter(spec)
    if result is None:
        tail = (output.strip().splitlines() or ["no output"])[-1]
        name = " ".join(part for part in (trial.kind, trial.agent) if part)
        return {"error": f"{name} failed (exit {code}): {tail}"}
    result["wall_s"] = round(time.perf_counter() - started, 1)
    return result


def _interpreter(spec: str) -> tuple[dict[str, Any] | None, int | None, str]:
    """The result (None where the trial failed), its exit code and its stderr."""
    proc = subprocess.run([sys.executable, "-m", "trainer.benchmark.trial", spec], capture_output=True, text=True,
                          env={**os.environ, "CITYLEARN_OFFLINE": "1"})
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        return None, proc.returncode, proc.stderr
    return json.loads(lines[-1]), proc.returncode, proc.stderr


def _forked(spec: str) -> tuple[dict[str, Any] | None, int | None, str]:
    """As :func:`_interpreter`, forked from the server; its output is its stdout and stderr together."""
    from trainer.benchmark.trial import forked_child  # lazy: it imports torch, which this process needs not

    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(TRIAL_PRELOAD)  # read once, when the first trial starts the server
    receive, send = context.Pipe(duplex=False)
    with tempfile.TemporaryDirectory() as tmp:
        output = Path(tmp) / "output.txt"  # the child's stdout and stderr: a failure's last line names it
        process = context.Process(target=forked_child, args=(spec, send, str(output)), name="benchmark-trial")
        process.start()
        send.close()  # the child holds its own end: EOF here once it exits, whatever becomes of it
        try:
            result = receive.recv()
        except EOFError:
            result = None
        process.join()
        printed = output.read_text(encoding="utf-8") if output.exists() else ""
    if process.exitcode != 0 or result is None:
        return None, process.exitcode, printed
    return json.loads(result), process.exitcode, printed


def plan_trials(agents: list[str], sizes: Sizes, cores: int) -> list[Trial]:
    """The interleaved order: env plain/product, then each agent's plain/product pairs, then the sweep."""
    trials: list[Trial] = []
    for _ in range(sizes.repeats):
        trials += [Trial(TrialKind.ENV_PLAIN), Trial(TrialKind.ENV_PRODUCT)]
        for agent in agents:
            trials += [Trial(TrialKind.PLAIN, agent), Trial(TrialKind.PRODUCT, agent)]
        trials += [Trial(TrialKind.IMITATION, agent) for agent in agents if agent_spec(agent).warm_start]
    for n in sizes.sweep or _sweep(cores):
        trials.append(Trial(TrialKind.SWEEP, n_envs=n))
    trials += [Trial(TrialKind.SIMULATOR, n_envs=n) for n in sizes.simulator]
    return trials


def _sweep(cores: int) -> tuple[int, ...]:

    counts, n = [], 1
    while n <= ENVS_PER_CORE * cores:
        counts.append(n)
        n *= 2
    return tuple(counts)


def machine() -> dict[str, Any]:
    """Cores, CPU model, GPU and versions: the figures mean nothing without them."""
    import torch  # lazy: torch takes seconds to import

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {"cores": cpu_cores(), "cpu": cpu, "gpu": gpu, "python": platform.python_version(),
            "torch": torch.__version__, "platform": platform.platform()}


def summarise(trials: list[Trial]) -> dict[str, Any]:
    """Medians per (kind, agent), ratios product/plain and peak memory."""

    def figures(kind: TrialKind | str, agent: str | None, key: str) -> list[float]:
        return [t.result[key] for t in trials if t.kind == kind and t.agent == agent
                and isinstance(t.result.get(key), (int, float))]

    def median(values: list[float]) -> float | None:
        return round(statistics.median(values), 2) if values else None

    out: dict[str, Any] = {
        "env": {},
        "agents": {},
        "sweep": {},
        "simulator": {},
        "imitation": {},
        "errors": [t.result["error"] for t in trials if "error" in t.result],
    }
    for agent in sorted({t.agent for t in trials if t.kind == TrialKind.IMITATION and t.agent}):
        out["imitation"][agent] = {  # small figures (members a second, seconds a minibatch): not to two decimals
            key: (float(f"{statistics.median(values):.4g}") if (values := figures(TrialKind.IMITATION, agent, key))
                  else None)
            for key in ("members_per_s", "member_s", "update_s", "members_with_critic_per_s", "update_with_critic_s",
                        "epochs", "minibatches")}
    plain_env, product_env = (
        median(figures(TrialKind.ENV_PLAIN, None, "steps_per_s")),
        median(figures(TrialKind.ENV_PRODUCT, None, "steps_per_s")),
    )
    out["env"] = {
        "plain_steps_per_s": plain_env,
        "product_steps_per_s": product_env,
        "ratio": _ratio(product_env, plain_env),
    }
    for agent in sorted({t.agent for t in trials if t.agent}):
        row: dict[str, Any] = {}
        for side in ("plain", "product"):
            row[f"{side}_steps_per_s"] = median(figures(side, agent, "steps_per_s"))
            row[f"{side}_peak_rss_mb"] = median(figures(side, agent, "peak_rss_mb"))
            row[f"{side}_tree_pss_mb"] = median(figures(side, agent, "tree_pss_mb"))
            if agent_spec(agent).off_policy:
                row[f"{side}_updates_per_s"] = median(figures(side, agent, "updates_per_s"))
        row["product_n_envs"] = next(
            (
                t.result.get("n_envs")
                for t in trials
                if t.kind == TrialKind.PRODUCT and t.agent == agent and "n_envs" in t.result
            ),
            None,
        )
        row["ratio"] = _ratio(row["product_steps_per_s"], row["plain_steps_per_s"])
        row["rss_ratio"] = _ratio(row["product_peak_rss_mb"], row["plain_peak_rss_mb"])
        row["pss_ratio"] = _ratio(row["product_tree_pss_mb"], row["plain_tree_pss_mb"])
        if agent_spec(agent).off_policy:
            row["updates_ratio"] = _ratio(row["product_updates_per_s"], row["plain_updates_per_s"])
        row["samples"] = len(figures(TrialKind.PRODUCT, agent, "steps_per_s"))
        out["agents"][agent] = row
    for t in trials:
        if t.kind in (TrialKind.SWEEP, TrialKind.SIMULATOR) and "steps_per_s" in t.result:
            out[TrialKind(t.kind).value][str(t.n_envs)] = round(t.result["steps_per_s"], 1)
    return out


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 2) if a and b else None


def _run_trials(trials: list[Trial], configs: dict[int, Config], site: Site, device: str, sizes: Sizes,
                progress) -> None:
    """Each trial in its own process with the config of its seed (key 0 when seeds do not vary)."""
    with tempfile.TemporaryDirectory() as tmp:
        paths = {}
        for seed, cfg in configs.items():
            paths[seed] = Path(tmp) / f"config-{seed}.json"
            paths[seed].write_text(json.dumps(cfg.to_dict()), encoding="utf-8")
        for i, trial in enumerate(trials, 1):
            trial.result = measure(trial, paths[trial.seed], site, device, sizes)
            if progress is not None:
                progress(i, len(trials), trial)


def run_benchmark(cfg: Config, site: Site, device: str, agents: list[str], sizes: Sizes,
                  progress=None) -> dict[str, Any]:
    """Every trial in its own process, interleaved; returns machine, sizes, raw trials and summary."""
    info = machine()
    started = time.perf_counter()
    trials = plan_trials(agents, sizes, info["cores"])
    _run_trials(trials, {0: _bench_config(cfg, sizes)}, site, device, sizes, progress)
    return {
        "machine": info,
        "device": device,
        "sizes": asdict(sizes),
        "seconds": round(time.perf_counter() - started, 1),
        "summary": summarise(trials),
        "trials": [asdict(t) for t in trials],
    }


def run_learning_check(cfg: Config, site: Site, device: str, agents: list[str], seeds: list[int],
                       progress=None) -> dict[str, Any]:
    """CO2 kg/year of each agent trained by the plain SB3 loop and by the product: same seed, same
    timesteps (each agent's ``timesteps``), same environment and reward, same evaluation."""
    info = machine()
    started = time.perf_counter()
    trials = [
        Trial(kind, agent, seed=seed)
        for seed in seeds
        for agent in agents
        for kind in (TrialKind.LEARN_PLAIN, TrialKind.LEARN_PRODUCT)
    ]
    configs = {seed: Config.model_validate({**cfg.to_dict(), "seed": seed}) for seed in seeds}
    _run_trials(trials, configs, site, device, Sizes(), progress)
    rows: dict[str, Any] = {}
    for agent in agents:
        row = {side: [t.result.get("co2_kg_per_year") for t in trials if t.agent == agent and t.kind == f"learn_{side}"]
               for side in ("plain", "product")}
        row["timesteps"] = next(
            (t.result["timesteps"] for t in trials if t.agent == agent and "timesteps" in t.result), None
        )
        rows[agent] = row
    return {"machine": info, "device": device, "seeds": seeds, "seconds": round(time.perf_counter() - started, 1),
            "agents": rows, "errors": [t.result["error"] for t in trials if "error" in t.result],
            "trials": [asdict(t) for t in trials]}


def format_learning(report: dict[str, Any]) -> str:
    """CO2 per seed for both sides, with mean and spread: is the difference within the seeds' noise?"""
    lines = [f"{'agent':6} {'steps':>7} {'side':8} " + " ".join(f"{'seed ' + str(s):>10}" for s in report["seeds"])
             + f" {'mean':>10} {'stdev':>8}"]
    for agent, row in report["agents"].items():
        for side in ("plain", "product"):
            values = [v for v in row[side] if isinstance(v, (int, float))]
            mean = statistics.mean(values) if values else None
            spread = statistics.stdev(values) if len(values) > 1 else None
            cells = " ".join(f"{v:>10,.0f}" if isinstance(v, (int, float)) else f"{'-':>10}" for v in row[side])
            lines.append(
                f"{agent:6} {row['timesteps'] or 0:>7,} {side:8} {cells} "
                f"{'-' if mean is None else f'{mean:,.0f}':>10} {'-' if spread is None else f'{spread:,.0f}':>8}"
            )
    lines += [f"error: {e}" for e in report["errors"]]
    return "\n".join(lines)


def format_report(report: dict[str, Any]) -> str:
    """The table a person reads: each figure for the plain recipe and the product, and their ratio."""
    m, s = report["machine"], report["summary"]
    lines = [
        f"machine: {m['cpu']}, {m['cores']} cores, GPU {m['gpu'] or 'none'}; device {report['device']}; "
        f"torch {m['torch']}; {report['sizes']['repeats']} interleaved repeats, medians; {report['seconds']:.0f} s",
        "",
        f"{'measure':34} {'plain':>10} {'product':>10} {'ratio':>7}",
    ]

    def row(label: str, a, b, r) -> None:
        fmt = lambda v: "-" if v is None else f"{v:,.1f}"  # noqa: E731
        lines.append(f"{label:34} {fmt(a):>10} {fmt(b):>10} {('-' if r is None else f'{r:.2f}x'):>7}")

    row("environment steps/s", s["env"]["plain_steps_per_s"], s["env"]["product_steps_per_s"], s["env"]["ratio"])
    for agent, a in s["agents"].items():
        envs = f" ({a['product_n_envs']} envs)" if a.get("product_n_envs", 1) and a.get("product_n_envs", 1) > 1 else ""
        row(f"{agent} training steps/s{envs}", a["plain_steps_per_s"], a["product_steps_per_s"], a["ratio"])
        if "updates_ratio" in a:
            row(f"{agent} gradient updates/s", a["plain_updates_per_s"], a["product_updates_per_s"], a["updates_ratio"])
        row(f"{agent} peak RSS MB (trainer process)", a["plain_peak_rss_mb"], a["product_peak_rss_mb"], a["rss_ratio"])
        row(f"{agent} memory MB, all processes (PSS)", a["plain_tree_pss_mb"], a["product_tree_pss_mb"], a["pss_ratio"])
    if s["sweep"]:
        lines += ["", "environment steps/s by parallel environments (product env, random actions):",
                  "  " + "   ".join(f"{n}: {v:,.0f}" for n, v in s["sweep"].items())]
    if s.get("imitation"):
        lines += ["", "the warm start, one imitation of the period's demonstrations (warm_start.epochs; an ensemble's "
                  "member where the agent teaches):"]
        for agent, m in s["imitation"].items():
            if m["members_per_s"] is None:
                continue
            lines.append(f"  {agent}: {m['members_per_s']:.4f} members/s ({m['member_s']:,.1f} s each: "
                         f"{m['epochs']:,.0f} epochs of {m['minibatches'] / max(m['epochs'], 1):,.0f} minibatches, "
                         f"{1000 * m['update_s']:.2f} ms each)")
            if m.get("members_with_critic_per_s") is not None and m["update_with_critic_s"] != m["update_s"]:
                lines.append(f"    with its critic, as every member fitted before: "
                             f"{m['members_with_critic_per_s']:.4f} members/s "
                             f"({1000 * m['update_with_critic_s']:.2f} ms a minibatch, timed in turn)")
    if s.get("simulator"):
        lines += ["", "environment steps/s by sites stepped at once (training simulator, one process, random actions,"
                  " guard and reward included):",
                  "  " + "   ".join(f"{n}: {v:,.0f}" for n, v in s["simulator"].items())]
    for error in s["errors"]:
        lines.append(f"error: {error}")
    return "\n".join(lines)



def progress_line(i: int, total: int, trial: Trial) -> str:
    """One line per finished trial, for the console while the benchmark runs."""
    figure, co2 = trial.result.get("steps_per_s"), trial.result.get("co2_kg_per_year")
    shown = trial.result.get("error") or (f"{figure:,.1f} steps/s" if figure is not None else "") or (
        f"seed {trial.seed}: {co2:,.0f} kg CO2/year" if co2 is not None else "")
    envs = f"x{trial.n_envs}" if trial.kind == TrialKind.SWEEP else ""
    return " ".join(part for part in (f"[{i}/{total}]", str(trial.kind), trial.agent or "", envs, shown) if part)


def _check_writable(path: Path) -> None:
    """Refuse a ``--json`` path whose folder cannot be made or written into, before anything is measured."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path.parent, prefix=f".{path.name}-"):
            pass
    except OSError as exc:
        raise UsageError(f"cannot write the figures to {path}: {exc.strerror} (choose another --json)") from None
    if path.is_dir():
        raise UsageError(f"--json {path} is a folder: name a file in it")


def run_command(cfg: Config, given: Site | None, agents: list[str], quick: bool, repeats: int | None,
                learning: bool, seeds: list[int], json_path: str | None = None,
                progress: Callable[[int, int, Trial], None] | None = None,
                sweep: tuple[int, ...] | None = None) -> tuple[str, bool]:
    """`trainer benchmark`: its table (and the figures as JSON at ``json_path``), and whether any trial failed."""
    if json_path:
        _check_writable(Path(json_path))  # fail now, not after five minutes
    sizes = Sizes.quick() if quick else Sizes()
    sizes = replace(sizes, repeats=repeats or sizes.repeats, sweep=sweep or sizes.sweep)
    report, text, failed = _measure(cfg, given, agents, sizes, learning, seeds, progress)
    if json_path:
        write_json_atomic(Path(json_path), report)
        text += f"\nfigures written to {json_path}"
    return text, failed


def _measure(cfg: Config, given: Site | None, agents: list[str], sizes: Sizes, learning: bool,
             seeds: list[int], progress: Callable[[int, int, Trial], None] | None,
             ) -> tuple[dict[str, Any], str, bool]:
    device = resolve_device(cfg.gpu.device)
    with site_for(cfg, given) as site:
        cfg = site.settled(cfg)  # the trials' children load a site by its schema alone: they get the settled config
        if learning:
            report = run_learning_check(cfg, site, device, agents, seeds, progress)
            return report, format_learning(report), bool(report["errors"])
        report = run_benchmark(cfg, site, device, agents, sizes, progress)
        return report, format_report(report), bool(report["summary"]["errors"])
