"""The physical limit: a perfect-foresight linear program of the site, solved with HiGHS.

Knowing the whole evaluation period in advance (load, PV, carbon intensity, every car's arrival,
departure and target), what is the least grid CO2 the site's battery and EV chargers can reach
while every reachable departure is met? No controller can do better, so it is the yardstick
for the agents: ``co2_share_of_optimum_pct`` is an agent's CO2 cut as a share of this one.

The program (its variables, limits and objective) is trainer.shipped.program's, which the day-ahead
planner solves too, over a day, and which an exported planner ships with; it relaxes CityLearn's
non-convex details to their best case, so its optimum is a bound. On
the built-in site the curves are flat (trainer.site.scenario pins them), so only fade differs. The
dispatch is then replayed through CityLearn (:class:`OptimumReplay`): that is what a controller
with perfect foresight really reaches.

Buildings with thermal storage or heat pumps driven by the controller, or with dynamic (thermal
model) simulation, are outside the model: :class:`OptimumUnavailable` says which and why.
"""

from __future__ import annotations

import bisect
from typing import Any

import numpy as np

from trainer.env.citylearn import ActionScale, action_layout
from trainer.references.optimum_model import EV_ACTION_PREFIX
from trainer.shipped.controller import ChargingPath, minimum_action
from trainer.shipped.program import EvSession, Solution, solve

__all__ = ["OptimumReplay", "Solution", "solve"]


class OptimumReplay:
    """The LP's dispatch, step by step, as a controller (what perfect foresight reaches in CityLearn).

    With the model's ``sessions`` it also knows each car's departure and goal ahead: where a car arrives with less
    than the model assumed (a charger file that gives no arrival state of charge, so CityLearn keeps what the car
    had), its charge is raised to the least that still serves it by its departure. The EV guard cannot: on the
    official datasets a departure is often unknown (-1) until its last hour.
    """

    name = "optimum"

    def __init__(self, solution: Solution, sessions: tuple[EvSession, ...] | list[EvSession] = ()) -> None:
        self.solution = solution
        # Per charger, its sessions' first steps in order, and each session's deadlines (its interim needs, then its
        # departure: step, kWh stored by then, path): a step finds its session by bisection, not by a walk through the
        # year's sessions (in a profile of a year's replay the walk was a quarter of the controller's own time).
        self.firsts: dict[str, list[int]] = {}
        self.deadlines: dict[tuple[str, int], list[tuple[int, float, ChargingPath]]] = {}
        for session in sorted(sessions, key=lambda s: s.steps[0]):
            if session.path is None:
                continue
            first = session.steps[0]
            for k, need in (*session.interim_needs, (len(session.steps) - 1, session.need_kwh)):
                if need > 0:
                    if (session.charger, first) not in self.deadlines:
                        self.firsts.setdefault(session.charger, []).append(first)
                    self.deadlines.setdefault((session.charger, first), []).append(
                        (first + k, session.arrival_kwh + need, session.path))
        self._on: Any = None  # the environment :meth:`act` last read its layout from
        self._layout: list[tuple[int, str, Any]] = []  # each action's building, name and charger (None: not one)
        self._scale: ActionScale | None = None

    def _served(self, charger: Any, t: int, action: float) -> float:
        """``action`` raised to the least that serves the car connected to ``charger`` by its next deadline."""
        ev = charger.connected_electric_vehicle
        firsts = self.firsts.get(charger.charger_id, [])
        session = bisect.bisect_right(firsts, t) - 1  # the one session a step can be in: the last begun by then
        if ev is None or session < 0:
            return action
        for deadline, goal, path in self.deadlines[(charger.charger_id, firsts[session])]:
            if t <= deadline:
                energy = max(float(ev.battery.energy_init), path.min_soc * path.capacity_kwh)
                return minimum_action(path, energy, goal, deadline - t, action)
        return action

    def act(self, obs: np.ndarray, env: Any) -> np.ndarray:
        if self._on is not env:  # read once per environment: its actions' names and scale do not change
            chargers = {f"{EV_ACTION_PREFIX}{c.charger_id}": c for b in env.buildings
                        for c in b.electric_vehicle_chargers or []}
            self._on, self._scale = env, ActionScale.of(env)
            self._layout = [(b, name, chargers.get(name)) for b, name in action_layout(env)]
        t = env.time_step
        native: list[float] = []
        for b, name, charger in self._layout:
            if name == "electrical_storage" and b in self.solution.battery_actions:
                series = self.solution.battery_actions[b]
            elif name.startswith(EV_ACTION_PREFIX):
                series = self.solution.ev_actions.get(name[len(EV_ACTION_PREFIX):])
            else:
                series = None
            action = float(np.clip(series[t], -1.0, 1.0)) if series is not None and t < len(series) else 0.0
            if charger is not None:
                action = self._served(charger, t, action)
            native.append(action)
        return self._scale.to_agent(native)
