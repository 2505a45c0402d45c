"""CityLearn 3.0.2's ``Battery`` for many batteries in many environments at once, as numpy arrays.

A bank holds M batteries (their parameters, shape (M,)) in N environments (their state, shape (N, M)).
``charge`` is ``Battery.charge`` step for step: the requested kWh limited by the capacity-power curve at
the state of charge, then twice (as CityLearn iterates) by the power-efficiency curve at the limited power
and by the degraded capacity (charging) or the depth of discharge (discharging); the square root of the
efficiency applied on the way in and again on the way out; the state of charge kept in float32 as
CityLearn keeps it; the capacity degraded by the energy moved. ``carry_over`` is ``next_time_step``: the
standby loss, floored at the depth of discharge. tests/test_sim.py drives both with the same actions.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any

import numpy as np

# CityLearn's guard against division by zero (citylearn.base.ZERO_DIVISION_PLACEHOLDER).
TINY = 1e-8


def curve_at(value: np.ndarray, xs: np.ndarray, ys: np.ndarray, slopes: np.ndarray | None = None) -> np.ndarray:
    """CityLearn's piecewise-linear curves, per battery: the segment is searchsorted(x, v, 'left') - 1 clamped to
    the first and last one, extended linearly beyond the ends. xs and ys (..., K) broadcast against value (...);
    ``slopes`` (..., K - 1) are the segments' (:func:`curve_slopes`), where the caller keeps them."""
    if xs.shape[-1] == 2:  # one segment (most datasets' curves): no search, no gather
        x0, x1, y0, y1 = xs[..., 0], xs[..., 1], ys[..., 0], ys[..., 1]
        return y0 + (y1 - y0) * (value - x0) / (x1 - x0)
    # The same line as a sum of hinges (the first segment's line, then each later segment's change of slope from
    # its start on): no search and no gather, several times faster on the simulator's small arrays.
    slopes = curve_slopes(xs, ys) if slopes is None else slopes
    bends = (slopes[..., 1:] - slopes[..., :-1]) * np.maximum(value[..., None] - xs[..., 1:-1], 0.0)
    return ys[..., 0] + slopes[..., 0] * (value - xs[..., 0]) + bends.sum(axis=-1)


def curve_slopes(xs: np.ndarray, ys: np.ndarray) -> np.ndarray:
    """Each segment's slope of the curves ``xs``, ``ys`` (..., K)."""
    return np.diff(ys, axis=-1) / np.diff(xs, axis=-1)


def _stack_curves(curves: list[Any]) -> tuple[np.ndarray, np.ndarray]:
    """Curves of different lengths as (M, K) arrays, the shorter ones padded by repeating their last segment's
    end beyond it (a point past the end changes nothing where the segment index is clamped)."""
    arrays = [np.asarray(c, dtype=float) for c in curves]
    k = max((a.shape[1] for a in arrays), default=2)
    xs = np.zeros((len(arrays), k))
    ys = np.zeros((len(arrays), k))
    for i, a in enumerate(arrays):
        n = a.shape[1]
        xs[i, :n], ys[i, :n] = a
        if n < k:  # extend along the last segment so the extrapolation is the same line
            slope = (a[1, -1] - a[1, -2]) / (a[0, -1] - a[0, -2])
            extra = a[0, -1] + np.arange(1, k - n + 1)
            xs[i, n:], ys[i, n:] = extra, a[1, -1] + slope * (extra - a[0, -1])
    return xs, ys


@dataclass(frozen=True)
class BatterySpec:
    """The parameters of M batteries, read from CityLearn's objects (each shape (M,) or (M, K))."""

    capacity: np.ndarray
    nominal_power: np.ndarray
    loss: np.ndarray  # standby loss per step (CityLearn's loss_coefficient, already per step)
    min_soc: np.ndarray  # 1 - depth_of_discharge, in [0, 1]
    capacity_loss: np.ndarray  # capacity_loss_coefficient
    initial_soc: np.ndarray
    efficiency_x: np.ndarray
    efficiency_y: np.ndarray
    power_x: np.ndarray
    power_y: np.ndarray
    hours: float

    # The curves' slopes, taken once rather than at each of the guard's many steps of the physics.
    @cached_property
    def efficiency_slopes(self) -> np.ndarray:
        return curve_slopes(self.efficiency_x, self.efficiency_y)

    @cached_property
    def power_slopes(self) -> np.ndarray:
        return curve_slopes(self.power_x, self.power_y)

    @classmethod
    def of(cls, batteries: list[Any], seconds_per_time_step: float) -> BatterySpec:
        def column(name: str) -> np.ndarray:
            return np.asarray([float(getattr(b, name)) for b in batteries], dtype=float)

        efficiency_x, efficiency_y = _stack_curves([b.power_efficiency_curve for b in batteries])
        power_x, power_y = _stack_curves([b.capacity_power_curve for b in batteries])
        return cls(
            capacity=column("capacity"), nominal_power=column("nominal_power"), loss=column("loss_coefficient"),
            min_soc=np.clip(1.0 - column("depth_of_discharge"), 0.0, 1.0),
            capacity_loss=column("capacity_loss_coefficient"),
            initial_soc=column("initial_soc"), efficiency_x=efficiency_x, efficiency_y=efficiency_y,
            power_x=power_x, power_y=power_y, hours=float(seconds_per_time_step) / 3600.0,
        )

    @property
    def size(self) -> int:
        return len(self.capacity)

    def gathered(self, index: np.ndarray) -> BatterySpec:
        """The parameters of battery ``index[...]`` at each place of ``index`` (shape (..., ) and (..., K))."""
        return replace(self, **{name: getattr(self, name)[index] for name in (
            "capacity", "nominal_power", "loss", "min_soc", "capacity_loss", "initial_soc",
            "efficiency_x", "efficiency_y", "power_x", "power_y")})


class BatteryBank:
    """The state of a :class:`BatterySpec`'s batteries in N environments."""

    def __init__(self, spec: BatterySpec, n_envs: int) -> None:
        self.spec = spec
        shape = (n_envs, spec.size)
        self.soc = np.zeros(shape, dtype=np.float32)  # CityLearn's soc array is float32
        self.degraded_capacity = np.zeros(shape)
        self.reset(np.ones(n_envs, dtype=bool))

    def reset(self, envs: np.ndarray) -> None:
        """Environments ``envs`` (a boolean mask) start an episode: initial state of charge, full capacity."""
        self.soc[envs] = np.maximum(self.spec.initial_soc, self.spec.min_soc).astype(np.float32)
        self.degraded_capacity[envs] = self.spec.capacity

    def carry_over(self, mask: np.ndarray | None = None) -> None:
        """The next step starts from this one's state of charge less the standby loss, floored (next_time_step)."""
        carried = carried_soc(self.spec, self.soc.astype(float)).astype(np.float32)
        self.soc[...] = carried if mask is None else np.where(mask, carried, self.soc)

    def charge(self, energy: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
        """``Battery.charge(energy)`` (kWh, + charges) where ``mask``; returns the energy balance (float32, kWh)."""
        s = self.spec
        final, balance = charged(s, self.soc.astype(float) * s.capacity, self.degraded_capacity, energy)
        balance = balance.astype(np.float32)
        soc = (final / np.maximum(s.capacity, TINY)).astype(np.float32)
        degraded = self.degraded_capacity
        wear = s.capacity_loss * s.capacity * np.abs(balance.astype(float)) / (2 * np.maximum(degraded, TINY))
        if mask is None:
            self.soc[...] = soc
            self.degraded_capacity = np.maximum(degraded - wear, 0.0)
            return balance
        self.soc[...] = np.where(mask, soc, self.soc)
        self.degraded_capacity = np.where(mask, np.maximum(degraded - wear, 0.0), degraded)
        return np.where(mask, balance, np.float32(0.0))


def carried_soc(s: BatterySpec, soc: np.ndarray) -> np.ndarray:
    """The state of charge a step starts with, from the one the step before ended with (standby loss, floor)."""
    return np.clip(soc * (1.0 - s.loss), s.min_soc, 1.0)


def charged(s: BatterySpec, stored: np.ndarray, degraded: np.ndarray, energy: np.ndarray
            ) -> tuple[np.ndarray, np.ndarray]:
    """``Battery.charge`` as numbers: (stored kWh after, energy balance) from ``stored`` kWh with ``energy`` kWh
    asked (+ charges). The spec's arrays broadcast against the state (a bank's (M,), or gathered (N, C))."""
    hours = s.hours
    min_energy = s.min_soc * s.capacity
    energy_init = np.maximum(min_energy, stored)
    max_power = s.nominal_power * curve_at(energy_init / np.maximum(s.capacity, TINY), s.power_x, s.power_y,
                                         s.power_slopes)
    max_energy = np.maximum(max_power, 0.0) * hours
    charging = energy >= 0
    requested = np.abs(energy)
    limited = np.minimum(requested, max_energy)
    for _ in range(2):  # CityLearn iterates twice: the efficiency depends on the power it limits
        efficiency = curve_at(np.clip(limited / hours / np.maximum(s.nominal_power, TINY), 0.0, 1.0),
                              s.efficiency_x, s.efficiency_y, s.efficiency_slopes)
        root = efficiency**0.5
        headroom = np.maximum(degraded - energy_init, 0.0) / np.maximum(root, TINY)
        reserve = np.maximum(energy_init - min_energy, 0.0) * root
        limited = np.minimum(np.minimum(requested, max_energy), np.where(charging, headroom, reserve))
    signed = np.where(charging, limited, -limited)
    final = np.where(charging, np.minimum(energy_init + signed * root, s.capacity),
                     np.maximum(min_energy, energy_init + signed / root))
    delta = final - energy_init
    return final, np.where(delta >= 0, delta / root, delta * root)
