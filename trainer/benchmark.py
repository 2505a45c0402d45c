"""`trainer benchmark`: the product's trainer against the plain SB3 recipe, side by side.

The plain recipe is what a user writes instead (CityLearn's quickstart): ``CityLearnEnv(schema,
central_agent=True)`` → ``NormalizedObservationWrapper`` → ``StableBaselines3Wrapper`` → an SB3
model with ``"MlpPolicy"`` → ``model.learn(N)``: one environment, one process, torch's defaults.
The product is :class:`trainer.training.StageTrainer` as a night runs it (parallel environments,
FastSAC, learning while stepping, checkpoints and callbacks included).

Both get the same hyperparameters and the same rollout size (the product splits it over its
environments). Every measurement runs in a fresh Python process, so peak RSS belongs to it alone
and nothing warmed up by one side helps the other; pairs run interleaved (plain, product, plain,
product...) and the ratio is taken of the medians, so a noisy machine still gives a fair ratio.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import gymnasium
from stable_baselines3.common.callbacks import BaseCallback

from trainer.config import Config

BENCH_AGENTS = ("sac", "ppo", "a2c")


@dataclass(frozen=True)
class Sizes:
    """How much each measurement runs: defaults fit the whole benchmark in about 5 minutes on 2 cores."""

    env_steps: int = 600
    onpolicy_steps: int = 2000
    onpolicy_rollout: int | None = None  # None: the config's n_steps
    sac_steps: int = 400
    sac_learning_starts: int = 100
    sac_updates: int = 50
    repeats: int = 2
    sweep: tuple[int, ...] | None = None  # None: 1, 2, 4 ... up to the automatic choice's 4 per core

    @classmethod
    def quick(cls) -> "Sizes":
        """A smoke run for CI: every figure produced, none of them meaningful."""
        return cls(env_steps=60, onpolicy_steps=64, onpolicy_rollout=32, sac_steps=60, sac_learning_starts=30,
                   sac_updates=5, repeats=1, sweep=(1, 2))


@dataclass
class Trial:
    """One measurement, run in its own process by :func:`run_trial`."""

    kind: str  # env_plain | env_product | plain | product | sweep | learn_plain | learn_product
    agent: str | None = None
    n_envs: int = 1
    seed: int = 0  # which config: the learning check varies it
    result: dict[str, Any] = field(default_factory=dict)


# ----------------------------------------------------------------------------- inside the child


def _peak_rss_mb() -> dict[str, float | None]:
    """Peak resident memory of this process (Linux and macOS; Windows has no getrusage)."""
    try:
        import resource
    except ImportError:
        return {"peak_rss_mb": None}
    scale = 1 / 1024 if sys.platform != "darwin" else 1 / 1024 / 1024  # ru_maxrss: KiB on Linux, bytes on macOS
    return {"peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale, 1)}


def _tree_pss_mb() -> float | None:
    """Proportional memory of this process and its workers: pages they share (the forkserver's
    preloaded modules) counted once, which RSS, counting them in every process, does not."""
    import psutil

    try:
        procs = [psutil.Process(), *psutil.Process().children(recursive=True)]
        total = 0
        for proc in procs:
            info = proc.memory_full_info()
            total += getattr(info, "pss", info.uss)  # PSS on Linux; USS elsewhere
    except (psutil.Error, OSError):
        return None
    return round(total / 2**20, 1)


class _Stopwatch(BaseCallback):
    """Times environment steps from ``start_at`` to the end of training, and the memory there."""

    def __init__(self, start_at: int):
        super().__init__()
        self.start_at = start_at
        self.t0: float | None = None
        self.t1: float | None = None
        self.n0 = self.n1 = 0
        self.tree_pss_mb: float | None = None

    def _on_step(self) -> bool:
        if self.t0 is None and self.num_timesteps >= self.start_at:
            self.t0, self.n0 = time.perf_counter(), self.num_timesteps
        return True

    def _on_training_end(self) -> None:
        self.t1, self.n1 = time.perf_counter(), self.num_timesteps
        self.tree_pss_mb = _tree_pss_mb()  # the workers are still running here

    def rate(self) -> float:
        if self.t0 is None or self.t1 is None or self.n1 <= self.n0:
            return float("nan")
        return (self.n1 - self.n0) / (self.t1 - self.t0)


def _bench_config(cfg: Config, sizes: Sizes) -> Config:
    """The config both sides train with: learning starts early and nothing periodic intervenes."""
    data = cfg.to_dict()
    data["sac"]["learning_starts"] = min(cfg.sac.learning_starts, sizes.sac_learning_starts)
    for agent in ("ppo", "a2c"):
        if sizes.onpolicy_rollout is not None:
            data[agent]["n_steps"] = sizes.onpolicy_rollout
            data[agent]["n_envs"] = 0
        if agent == "ppo":
            data[agent]["batch_size"] = min(cfg.ppo.batch_size, data[agent]["n_steps"])
    data["schedule"]["curve_every_steps"] = 10**9  # learning-curve evaluations are not training
    data["output"]["tensorboard"] = False
    return Config.model_validate(data)


def _warmup(agent: str, cfg: Config) -> int:
    """Steps before the stopwatch starts: SAC's collection without updates, one step otherwise."""
    return cfg.sac.learning_starts + 1 if agent == "sac" else 1


def _steps(agent: str, sizes: Sizes) -> int:
    return sizes.sac_steps if agent == "sac" else sizes.onpolicy_steps


def _env_rate(env, steps: int) -> float:
    env.reset()
    start = time.perf_counter()
    for _ in range(steps):
        _, _, terminated, truncated, _ = env.step(env.action_space.sample())
        if terminated or truncated:
            env.reset()
    return steps / (time.perf_counter() - start)


def _plain_env(schema: Path):
    from citylearn.citylearn import CityLearnEnv
    from citylearn.wrappers import NormalizedObservationWrapper, StableBaselines3Wrapper

    return StableBaselines3Wrapper(NormalizedObservationWrapper(CityLearnEnv(str(schema), central_agent=True)))


def _update_rate(model, batch_size: int, updates: int) -> float:
    model.train(gradient_steps=2, batch_size=batch_size)  # warm-up
    start = time.perf_counter()
    model.train(gradient_steps=updates, batch_size=batch_size)
    return updates / (time.perf_counter() - start)


def run_trial(trial: Trial, cfg: Config, schema: Path, device: str, sizes: Sizes) -> dict[str, Any]:
    """Measure one trial in this process (called in a fresh child by :func:`measure`)."""
    from trainer.env import make_sb3_env, make_training_vec_env

    if trial.kind == "env_plain":
        env = _plain_env(schema)
        return {"steps_per_s": _env_rate(env, sizes.env_steps)}
    if trial.kind == "env_product":
        return {"steps_per_s": _env_rate(make_sb3_env(cfg, schema, "train", cfg.seed), sizes.env_steps)}
    if trial.kind in ("learn_plain", "learn_product"):
        return _learn_and_evaluate(trial, cfg, schema, device)
    if trial.kind == "sweep":
        return {"steps_per_s": _vec_env_rate(make_training_vec_env(cfg, schema, cfg.seed, trial.n_envs, trial.n_envs > 1),
                                             sizes.env_steps)}
    agent = trial.agent
    assert agent is not None
    stopwatch = _Stopwatch(_warmup(agent, cfg))
    if trial.kind == "plain":
        model, n_envs = _train_plain(agent, _plain_env(schema), cfg, device, _steps(agent, sizes), stopwatch), 1
    else:
        model, n_envs = _train_product(agent, cfg, schema, device, _steps(agent, sizes), stopwatch)
    out: dict[str, Any] = {"steps_per_s": stopwatch.rate(), "n_envs": n_envs, "torch_threads": _threads(),
                           "tree_pss_mb": stopwatch.tree_pss_mb}
    if agent == "sac":
        if hasattr(model, "defer_training"):
            model.defer_training = False  # time the update itself, not its deferral
        out["updates_per_s"] = _update_rate(model, cfg.sac.batch_size, sizes.sac_updates)
    return out


def _train_plain(agent: str, env, cfg: Config, device: str, steps: int, callback=None):
    """The plain recipe: SB3's own class on one environment, torch's default threads."""
    from stable_baselines3 import A2C, PPO, SAC

    from trainer.agents import hyperparameters

    algo = {"sac": SAC, "ppo": PPO, "a2c": A2C}[agent]
    model = algo("MlpPolicy", env, seed=cfg.seed, device=device, verbose=0, **hyperparameters(cfg.agent(agent)))
    model.learn(steps, callback=callback)
    return model


def _train_product(agent: str, cfg: Config, schema: Path, device: str, steps: int, callback=None):
    """The product: a night's StageTrainer (in a throw-away run folder). Returns (model, n_envs)."""
    from trainer.device import apply_gpu_flags
    from trainer.run_dir import RunDir
    from trainer.stages import RunContext
    from trainer.training import StageTrainer

    apply_gpu_flags(cfg.gpu, device)
    with tempfile.TemporaryDirectory() as tmp:
        trainer = StageTrainer(RunContext(cfg, RunDir(Path(tmp)), schema, device), agent, steps,
                               callbacks=[callback] if callback else None)
        try:
            return trainer.train(), trainer.n_envs
        finally:
            trainer.close()


class _IgnoreResetSeed(gymnasium.Wrapper):
    """The one fix the plain loop needs to learn at all: CityLearn adopts SB3's reset seed as the seed
    of its episode windows, so every episode would be the same fortnight (see trainer.env)."""

    def reset(self, *, seed=None, options=None):
        return self.env.reset(options=options)


def _learn_and_evaluate(trial: Trial, cfg: Config, schema: Path, device: str) -> dict[str, Any]:
    """Train ``trial.agent`` for its timesteps with one side, then CO2 kg/year over the evaluation period."""
    from citylearn.wrappers import NormalizedObservationWrapper, StableBaselines3Wrapper

    from trainer.controllers import PolicyController
    from trainer.env import make_citylearn_env, make_sb3_env
    from trainer.metrics import run_episode
    from trainer.stages import training_timesteps

    agent = trial.agent
    assert agent is not None
    steps = training_timesteps(cfg, agent, schema)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        if trial.kind == "learn_plain":
            # The same environment, reward and episode windows as the product; SB3's own loop.
            env = _IgnoreResetSeed(StableBaselines3Wrapper(NormalizedObservationWrapper(
                make_citylearn_env(cfg, schema, "train", cfg.seed))))
            model = _train_plain(agent, env, cfg, device, steps)
        else:
            model, _ = _train_product(agent, cfg, schema, device, steps)
        train_s = time.perf_counter() - started
        eval_env = make_sb3_env(cfg, schema, "eval", cfg.seed, eval_days=cfg.schedule.eval_days)
        try:
            metrics = run_episode(PolicyController(agent, model), eval_env, Path(tmp) / "timeseries.csv")
        finally:
            eval_env.close()
    return {"co2_kg_per_year": metrics["co2_kg_per_year"], "timesteps": int(model.num_timesteps),
            "ev_departure_soc_met_pct": metrics.get("ev_departure_soc_met_pct"),  # CO2 can fall by not charging
            "train_s": round(train_s, 1), "seed": cfg.seed}


def _vec_env_rate(env, steps: int) -> float:
    import numpy as np

    try:
        env.reset()
        actions = np.stack([env.action_space.sample() for _ in range(env.num_envs)])
        rounds = max(steps // env.num_envs, 1)
        start = time.perf_counter()
        for _ in range(rounds):
            env.step(actions)
        return rounds * env.num_envs / (time.perf_counter() - start)
    finally:
        env.close()


def _threads() -> int:
    import torch

    return torch.get_num_threads()


# ----------------------------------------------------------------------------- the parent


def measure(trial: Trial, config_path: Path, schema: Path, device: str, sizes: Sizes) -> dict[str, Any]:
    """Run one trial in a fresh interpreter; its last stdout line is the JSON result."""
    spec = json.dumps({"trial": asdict(trial), "config": str(config_path), "schema": str(schema),
                       "device": device, "sizes": asdict(sizes)})
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "trainer.benchmark", spec], capture_output=True, text=True,
                          env={**os.environ, "CITYLEARN_OFFLINE": "1"})
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": f"{trial.kind} {trial.agent or ''} failed (exit {proc.returncode}): {tail}"}
    result = json.loads(lines[-1])
    result["wall_s"] = round(time.perf_counter() - started, 1)
    return result


def plan_trials(agents: list[str], sizes: Sizes, cores: int) -> list[Trial]:
    """The interleaved order: env plain/product, then each agent's plain/product pairs, then the sweep."""
    trials: list[Trial] = []
    for _ in range(sizes.repeats):
        trials += [Trial("env_plain"), Trial("env_product")]
        for agent in agents:
            trials += [Trial("plain", agent), Trial("product", agent)]
    for n in sizes.sweep or _sweep(cores):
        trials.append(Trial("sweep", n_envs=n))
    return trials


def _sweep(cores: int) -> tuple[int, ...]:
    from trainer.agents import ENVS_PER_CORE

    counts, n = [], 1
    while n <= ENVS_PER_CORE * cores:
        counts.append(n)
        n *= 2
    return tuple(counts)


def machine() -> dict[str, Any]:
    """Cores, CPU model, GPU and versions: the figures mean nothing without them."""
    import torch

    from trainer.env import cpu_cores

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

    def figures(kind: str, agent: str | None, key: str) -> list[float]:
        return [t.result[key] for t in trials if t.kind == kind and t.agent == agent
                and isinstance(t.result.get(key), (int, float))]

    def median(values: list[float]) -> float | None:
        return round(statistics.median(values), 2) if values else None

    out: dict[str, Any] = {"env": {}, "agents": {}, "sweep": {}, "errors": [t.result["error"] for t in trials if "error" in t.result]}
    plain_env, product_env = median(figures("env_plain", None, "steps_per_s")), median(figures("env_product", None, "steps_per_s"))
    out["env"] = {"plain_steps_per_s": plain_env, "product_steps_per_s": product_env, "ratio": _ratio(product_env, plain_env)}
    for agent in sorted({t.agent for t in trials if t.agent}):
        row: dict[str, Any] = {}
        for side in ("plain", "product"):
            row[f"{side}_steps_per_s"] = median(figures(side, agent, "steps_per_s"))
            row[f"{side}_peak_rss_mb"] = median(figures(side, agent, "peak_rss_mb"))
            row[f"{side}_tree_pss_mb"] = median(figures(side, agent, "tree_pss_mb"))
            if agent == "sac":
                row[f"{side}_updates_per_s"] = median(figures(side, agent, "updates_per_s"))
        row["product_n_envs"] = next((t.result.get("n_envs") for t in trials if t.kind == "product" and t.agent == agent
                                      and "n_envs" in t.result), None)
        row["ratio"] = _ratio(row["product_steps_per_s"], row["plain_steps_per_s"])
        row["rss_ratio"] = _ratio(row["product_peak_rss_mb"], row["plain_peak_rss_mb"])
        row["pss_ratio"] = _ratio(row["product_tree_pss_mb"], row["plain_tree_pss_mb"])
        if agent == "sac":
            row["updates_ratio"] = _ratio(row["product_updates_per_s"], row["plain_updates_per_s"])
        row["samples"] = len(figures("product", agent, "steps_per_s"))
        out["agents"][agent] = row
    for t in trials:
        if t.kind == "sweep" and "steps_per_s" in t.result:
            out["sweep"][str(t.n_envs)] = round(t.result["steps_per_s"], 1)
    return out


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 2) if a and b else None


def _run_trials(trials: list[Trial], configs: dict[int, Config], schema: Path, device: str, sizes: Sizes,
                progress) -> None:
    """Each trial in its own process with the config of its seed (key 0 when seeds do not vary)."""
    with tempfile.TemporaryDirectory() as tmp:
        paths = {}
        for seed, cfg in configs.items():
            paths[seed] = Path(tmp) / f"config-{seed}.json"
            paths[seed].write_text(json.dumps(cfg.to_dict()), encoding="utf-8")
        for i, trial in enumerate(trials, 1):
            trial.result = measure(trial, paths[trial.seed], schema, device, sizes)
            if progress is not None:
                progress(i, len(trials), trial)


def run_benchmark(cfg: Config, schema: Path, device: str, agents: list[str], sizes: Sizes,
                  progress=None) -> dict[str, Any]:
    """Every trial in its own process, interleaved; returns machine, sizes, raw trials and summary."""
    info = machine()
    started = time.perf_counter()
    trials = plan_trials(agents, sizes, info["cores"])
    _run_trials(trials, {0: _bench_config(cfg, sizes)}, schema, device, sizes, progress)
    return {"machine": info, "device": device, "sizes": asdict(sizes), "seconds": round(time.perf_counter() - started, 1),
            "summary": summarise(trials), "trials": [asdict(t) for t in trials]}


def run_learning_check(cfg: Config, schema: Path, device: str, agents: list[str], seeds: list[int],
                       progress=None) -> dict[str, Any]:
    """CO2 kg/year of each agent trained by the plain SB3 loop and by the product: same seed, same
    timesteps (each agent's ``timesteps``), same environment and reward, same evaluation."""
    info = machine()
    started = time.perf_counter()
    trials = [Trial(kind, agent, seed=seed) for seed in seeds for agent in agents for kind in ("learn_plain", "learn_product")]
    configs = {seed: Config.model_validate({**cfg.to_dict(), "seed": seed}) for seed in seeds}
    _run_trials(trials, configs, schema, device, Sizes(), progress)
    rows: dict[str, Any] = {}
    for agent in agents:
        row = {side: [t.result.get("co2_kg_per_year") for t in trials if t.agent == agent and t.kind == f"learn_{side}"]
               for side in ("plain", "product")}
        row["timesteps"] = next((t.result["timesteps"] for t in trials if t.agent == agent and "timesteps" in t.result), None)
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
            lines.append(f"{agent:6} {row['timesteps'] or 0:>7,} {side:8} {cells} "
                         f"{'-' if mean is None else f'{mean:,.0f}':>10} {'-' if spread is None else f'{spread:,.0f}':>8}")
    lines += [f"error: {e}" for e in report["errors"]]
    return "\n".join(lines)


def format_report(report: dict[str, Any]) -> str:
    """The table a person reads: each figure for the plain recipe and the product, and their ratio."""
    m, s = report["machine"], report["summary"]
    lines = [f"machine: {m['cpu']}, {m['cores']} cores, GPU {m['gpu'] or 'none'}; device {report['device']}; "
             f"torch {m['torch']}; {report['sizes']['repeats']} interleaved repeats, medians; {report['seconds']:.0f} s",
             "", f"{'measure':34} {'plain':>10} {'product':>10} {'ratio':>7}"]

    def row(label: str, a, b, r) -> None:
        fmt = lambda v: "-" if v is None else f"{v:,.1f}"  # noqa: E731
        lines.append(f"{label:34} {fmt(a):>10} {fmt(b):>10} {('-' if r is None else f'{r:.2f}x'):>7}")

    row("environment steps/s", s["env"]["plain_steps_per_s"], s["env"]["product_steps_per_s"], s["env"]["ratio"])
    for agent, a in s["agents"].items():
        envs = f" ({a['product_n_envs']} envs)" if a.get("product_n_envs", 1) and a.get("product_n_envs", 1) > 1 else ""
        row(f"{agent} training steps/s{envs}", a["plain_steps_per_s"], a["product_steps_per_s"], a["ratio"])
        if agent == "sac":
            row("sac gradient updates/s", a["plain_updates_per_s"], a["product_updates_per_s"], a["updates_ratio"])
        row(f"{agent} peak RSS MB (trainer process)", a["plain_peak_rss_mb"], a["product_peak_rss_mb"], a["rss_ratio"])
        row(f"{agent} memory MB, all processes (PSS)", a["plain_tree_pss_mb"], a["product_tree_pss_mb"], a["pss_ratio"])
    if s["sweep"]:
        lines += ["", "environment steps/s by parallel environments (product env, random actions):",
                  "  " + "   ".join(f"{n}: {v:,.0f}" for n, v in s["sweep"].items())]
    for error in s["errors"]:
        lines.append(f"error: {error}")
    return "\n".join(lines)


def _child_main(spec_json: str) -> None:
    from trainer import logs

    spec = json.loads(spec_json)
    logs.configure()  # to stderr, which the parent keeps for an error's last line
    cfg = Config.model_validate(json.loads(Path(spec["config"]).read_text(encoding="utf-8")))
    sizes = Sizes(**{**spec["sizes"], "sweep": tuple(spec["sizes"]["sweep"]) if spec["sizes"]["sweep"] else None})
    trial = Trial(**{k: v for k, v in spec["trial"].items() if k != "result"})
    result = run_trial(trial, cfg, Path(spec["schema"]), spec["device"], sizes)
    result.update(_peak_rss_mb())
    print(json.dumps(result))


if __name__ == "__main__":  # a child of measure(); the guard also keeps SubprocVecEnv's forkserver safe
    _child_main(sys.argv[1])
