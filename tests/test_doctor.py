"""`trainer doctor` and device profiles."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner

from trainer.cli.main import cli
from trainer.config.loading import load_config
from trainer.config.profiles import PROFILE_DIR, available

needs_no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")


def doctor(*args: str):
    return CliRunner().invoke(cli, ["doctor", *args])


@needs_no_cuda
def test_doctor_passes_without_a_warning_on_a_machine_without_a_gpu(monkeypatch):
    from trainer.cli import doctor as doctor_module

    monkeypatch.setattr(doctor_module, "nvidia_gpu_present", lambda: False)
    result = doctor()
    assert result.exit_code == 0, result.output
    assert "ok    cuda" in result.output and "no NVIDIA GPU here: training runs on the CPU" in result.output
    assert "ok    nvml" in result.output
    assert result.output.strip().endswith("0 failed, 0 warnings")


@needs_no_cuda
def test_a_gpu_torch_cannot_use_is_a_warning_with_the_fix(monkeypatch):
    from trainer.cli import doctor as doctor_module

    monkeypatch.setattr(doctor_module, "nvidia_gpu_present", lambda: True)
    result = doctor()
    assert result.exit_code == 0, result.output
    assert "warn  cuda" in result.output and "CUDA not available" in result.output
    assert "warn  nvml" in result.output


@needs_no_cuda
def test_require_gpu_fails_without_cuda():
    result = doctor("--require-gpu")
    assert result.exit_code == 1
    assert "FAIL  cuda" in result.output


def test_json_lists_every_check_with_a_status():
    result = doctor("--json")
    checks = json.loads(result.output)
    names = {c["name"] for c in checks}
    assert {"python", "packages", "torch", "config", "disk", "dataset", "host RAM"} <= names
    assert all(c["status"] in ("pass", "warn", "fail") for c in checks)


def test_bad_config_fails_with_the_key_named():
    result = doctor("--set", "sac.batch_size=0")
    assert result.exit_code == 1
    assert "FAIL  config" in result.output and "sac.batch_size" in result.output


def test_output_root_that_is_a_file_fails_the_disk_check(tmp_path):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    result = doctor("--set", f"output.root={blocker}/runs")
    assert result.exit_code == 1
    assert "FAIL  disk" in result.output and "set output.root to a writable folder" in result.output


def test_the_disk_check_leaves_no_folder_behind(tmp_path):
    """output.root is made by the first run, not by the doctor: a checkout stays as it was."""
    result = doctor("--set", f"output.root={tmp_path / 'new' / 'runs'}")
    assert "ok    disk" in result.output, result.output
    assert list(tmp_path.iterdir()) == []


def test_keys_that_did_nothing_are_gone_and_old_configs_still_load():
    from trainer.config.loading import describe, load_config

    keys = {row[0] for row in describe()}
    assert "gpu.mixed_precision" not in keys and "sac.max_grad_norm" not in keys and "ppo.max_grad_norm" in keys
    cfg = load_config(overrides=["gpu.mixed_precision=true", "sac.max_grad_norm=10"])  # a run folder made before
    assert not hasattr(cfg.gpu, "mixed_precision")


@pytest.mark.parametrize("name", available())
def test_every_profile_is_a_valid_overlay_with_its_reasons(name):
    path = PROFILE_DIR / f"{name}.yaml"
    assert path.read_text().startswith("#")  # each profile explains its numbers
    cfg = load_config(profile=path)
    assert cfg.gpu.device == ("cpu" if name == "cpu" else "cuda")
    # A profile sizes what the hardware bounds, never the networks: their size is chosen for quality on the run's
    # site (a GPU profile's 512x512 once overrode the 64x64 measured best on a dataset).
    assert (cfg.sac.net_arch, cfg.ppo.net_arch, cfg.a2c.net_arch) == (
        load_config().sac.net_arch, load_config().ppo.net_arch, load_config().a2c.net_arch)


def test_profiles_cover_the_hardware_users_have():
    assert available() == ["cpu", "h100-80gb", "rtx4060-laptop-8gb", "rtx5090-32gb", "t4-16gb"]


def test_profile_then_files_then_set():
    result = CliRunner().invoke(cli, ["config", "show", "--profile", "h100-80gb", "--set", "sac.batch_size=64"])
    assert result.exit_code == 0
    # --set beat the profile's batch; the profile's buffer kept
    assert "batch_size: 64" in result.output and "buffer_size: 1000000" in result.output


@needs_no_cuda
def test_auto_profile_says_which_it_picked():
    result = CliRunner().invoke(cli, ["config", "show", "--profile", "auto"])
    assert result.exit_code == 0
    assert "profile cpu (auto: no CUDA device)" in result.output


def test_unknown_profile_exits_2_and_help_lists_the_profiles():
    result = CliRunner().invoke(cli, ["config", "show", "--profile", "tpu-v5"])
    assert result.exit_code == 2
    assert "'tpu-v5' is not one of 'auto', 'cpu', 'h100-80gb'" in result.output
    shown = CliRunner().invoke(cli, ["train", "--help"]).output
    assert "[auto|cpu|h100-80gb|rtx4060-laptop-8gb|rtx5090-32gb|t4-16gb]" in shown


@pytest.mark.parametrize("gpu, total_bytes, major, expected", [
    ("NVIDIA GeForce RTX 4090", 25_757_220_864, 8, "rtx5090-32gb"),  # 23.99 GiB: a desktop card, not a laptop
    ("NVIDIA H100 80GB HBM3", 85_520_809_984, 9, "h100-80gb"),
    ("NVIDIA GeForce RTX 4060 Laptop GPU", 8_585_740_288, 8, "rtx4060-laptop-8gb"),
    ("Tesla T4", 15_828_320_256, 7, "t4-16gb"),
    ("Quadro RTX 5000", 16_898_195_456, 7, "t4-16gb"),  # unknown name: 17 GB, Turing
    ("NVIDIA RTX 6000 Ada Generation", 51_527_024_640, 8, "h100-80gb"),  # unknown name: 52 GB
])
def test_auto_profile_matches_the_gpu_by_name_then_memory(gpu, total_bytes, major, expected):
    from trainer.config.profiles import choose

    profile, why = choose(gpu, total_bytes, major)
    assert profile == expected and gpu in why


@pytest.mark.gpu
def test_gpu_switches_set_the_torch_flags():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from trainer.config.loading import load_config as load
    from trainer.run.device import apply_gpu_flags

    flags = apply_gpu_flags(load(overrides=["gpu.tf32=true", "gpu.cudnn_benchmark=true"]).gpu, "cuda")
    assert (
        flags["applied"] and torch.backends.cuda.matmul.allow_tf32 is True and torch.backends.cudnn.benchmark is True
    )


def test_tensorboard_off_for_want_of_the_package_is_said_with_the_fix(monkeypatch):
    from trainer.cli import doctor as doctor_module
    from trainer.config.loading import load_config

    monkeypatch.setattr(doctor_module, "tensorboard_installed", lambda: False)
    default = doctor_module.check_tensorboard(load_config())  # auto: off without a word of warning
    assert default.status == "pass" and "not installed" in default.detail
    asked = doctor_module.check_tensorboard(load_config(overrides=["output.tensorboard=true"]))
    assert asked.status == "warn" and "pip install 'tensorboard>=2.14'" in asked.fix
    assert doctor_module.check_tensorboard(load_config(overrides=["output.tensorboard=false"])).status == "pass"
    monkeypatch.setattr(doctor_module, "tensorboard_installed", lambda: True)
    assert doctor_module.check_tensorboard(load_config()).status == "pass"


def test_the_doctor_says_what_agents_train_on_and_refuses_vector_where_it_cannot(site_schema, tmp_path):
    from .test_sim import _thermal, variant

    default = doctor()
    assert "ok    simulator    agents train on the training simulator (train.simulator: auto)" in default.output
    chosen = doctor("--set", "train.simulator=citylearn")
    assert "ok    simulator    agents train on CityLearn (train.simulator: citylearn)" in chosen.output
    assert "models this dataset: train.simulator: auto uses it" in chosen.output
    thermal = str(variant(site_schema, tmp_path, _thermal, steps=48))
    refused = doctor("--schema", thermal, "--set", "train.simulator=vector")
    assert refused.exit_code == 1
    assert "FAIL  simulator" in refused.output and "dhw_storage" in refused.output
    assert "fix: set train.simulator: auto or citylearn" in refused.output
    fallback = doctor("--schema", thermal, "--set", "train.simulator=auto")
    assert "ok    simulator    agents train on CityLearn: the training simulator does not model" in fallback.output


def test_packages_imported_from_a_source_tree_are_a_warning_not_a_crash(monkeypatch):
    from importlib import metadata

    from trainer.cli import doctor as doctor_module

    def not_installed(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(doctor_module.metadata, "requires", not_installed)
    check = doctor_module.check_packages()
    assert check.status == "warn" and "not installed here" in check.detail and "pip install -e ." in check.fix
