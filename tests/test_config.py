"""Config validation: every error names the key, the expected and the received value."""

from __future__ import annotations

import pytest
import yaml

from trainer.base.errors import ConfigError
from trainer.config.loading import describe, load_config, parse_override
from trainer.config.sections import BUILT_IN_DRAWS, DEFAULT_CONFIG, ONE_PERIOD_DRAWS, Config


def error_of(*overrides: str, files=()) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(files, list(overrides))
    return str(info.value)


def test_defaults_validate_and_hash_is_stable(default_cfg):
    assert isinstance(default_cfg, Config)
    assert default_cfg.digest() == load_config().on_site(one_period=False).digest()
    assert default_cfg.digest() != load_config(overrides=["seed=7"]).digest()


def test_unknown_key_suggests_the_closest():
    assert error_of("sac.batch_sise=3") == "unknown config key 'sac.batch_sise': did you mean 'sac.batch_size'?"


def test_unknown_section_suggests_the_closest():
    assert "did you mean 'reward'?" in error_of("rewards.co2=1")


def test_out_of_range_names_key_expected_and_received():
    assert error_of("sac.batch_size=-5") == (
        "config key 'sac.batch_size': input should be greater than or equal to 1; got -5"
    )


def test_wrong_type_names_the_received_value():
    message = error_of("reward.co2=abc")
    assert message.startswith("config key 'reward.co2': input should be a valid number")
    assert message.endswith("got 'abc'")


def test_choice_lists_the_valid_values():
    assert error_of("gpu.device=tpu") == "config key 'gpu.device': input should be 'auto', 'cpu' or 'cuda'; got 'tpu'"
    assert error_of("warm_start.teacher=sak") == ("config key 'warm_start.teacher': input should be 'sac', 'ppo', "
                                                  "'a2c' or 'own'; got 'sak'")


def test_a_list_or_a_word_names_both():
    assert error_of("observations.ignore=autoo") == (
        "config key 'observations.ignore': input should be a valid list or 'auto'; got 'autoo'")


def test_timesteps_and_episodes_together_are_refused():
    assert error_of("ppo.episodes=3") == (
        "config key 'ppo': set only one of timesteps (500000) or episodes (3); set the other to null"
    )


def test_all_zero_reward_weights_are_refused():
    zeros = [f"reward.{k}=0" for k in ("co2", "cost", "ev", "grid", "solar")]
    assert error_of(*zeros) == "config key 'reward': at least one reward weight must be positive"


def test_yaml_syntax_error_gives_file_line_and_column(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("sac:\n  batch_size: 64\n  gamma: [0.9\n")
    message = error_of(files=[bad])
    assert message.startswith(f"{bad}:4:1: YAML syntax error")


def test_missing_config_file_is_named(tmp_path):
    missing = tmp_path / "nope.yaml"
    assert error_of(files=[missing]) == f"config file not found: {missing} (check the path given to --config)"


def test_files_merge_left_to_right_then_set(tmp_path):
    first, second = tmp_path / "a.yaml", tmp_path / "b.yaml"
    first.write_text(yaml.safe_dump({"sac": {"batch_size": 64, "tau": 0.01}}))
    second.write_text(yaml.safe_dump({"sac": {"batch_size": 128}}))
    cfg = load_config([first, second], ["sac.gamma=0.95"])
    assert (cfg.sac.batch_size, cfg.sac.tau, cfg.sac.gamma) == (128, 0.01, 0.95)
    assert cfg.ppo == load_config().ppo  # untouched sections keep their defaults


@pytest.mark.parametrize("text, expected", [
    ("sac.batch_size=128", (["sac", "batch_size"], 128)),
    ("ppo.net_arch=[32, 32]", (["ppo", "net_arch"], [32, 32])),
    ("gpu.tf32=false", (["gpu", "tf32"], False)),
    ("sac.episodes=null", (["sac", "episodes"], None)),
])
def test_override_values_are_parsed_as_yaml(text, expected):
    assert parse_override(text) == expected


def test_override_without_equals_explains_the_form():
    with pytest.raises(ConfigError, match=r"--set expects key.path=value, got 'sac.batch_size'"):
        parse_override("sac.batch_size")


def test_every_default_key_is_documented():
    rows = describe()
    documented = {path for path, _, text in rows if text.strip()}

    keys = {path for path, _, _ in rows}

    def leaves(node, prefix=""):
        for key, value in node.items():
            if isinstance(value, dict) and f"{prefix}{key}" not in keys:  # a section, not a mapping value
                yield from leaves(value, f"{prefix}{key}.")
            else:
                yield f"{prefix}{key}"

    defaults = set(leaves(yaml.safe_load(DEFAULT_CONFIG.read_text())))
    assert defaults == {path for path, _, _ in rows}
    assert defaults <= documented


@pytest.mark.parametrize("override, message", [
    ("schedule.budget=8hours", "config key 'schedule.budget': it expects a duration like 10h, 90m or 1h30m"),
    ("schedule.finish_by='25:00'", "config key 'schedule.finish_by': it expects a local time HH:MM such as 07:00"),
])
def test_the_night_s_budget_and_finish_time_are_checked_with_the_config(override, message):
    with pytest.raises(ConfigError) as error:
        load_config(overrides=[override])
    assert message in str(error.value)


def test_a_quick_night_evaluates_its_short_window_unless_a_shorter_one_is_set():
    from trainer.run.session import quick_night

    assert quick_night(load_config()).schedule.eval_days == 28
    # A smoke run ends when its stages reach their targets: its last does not learn on past it.
    assert load_config().schedule.last_stage_past_target == 16 and \
        quick_night(load_config()).schedule.last_stage_past_target == 1
    assert quick_night(load_config(overrides=["schedule.eval_days=3"])).schedule.eval_days == 3
    assert load_config().schedule.eval_days is None  # a full night still evaluates the whole period
    # Its warm start imitates the dataset's own year, briefly; a full night's is four years for 400 epochs, ten
    # times, and their student's 1,200 at a decaying rate.
    quick = quick_night(load_config()).warm_start
    assert (quick.epochs, quick.extra_draws, quick.ensemble, quick.sac_critic_updates) == (25, 0, 1, 0)
    assert quick_night(load_config(overrides=["warm_start.epochs=0"])).warm_start.epochs == 0  # off stays off
    full = load_config().warm_start
    assert (full.epochs, full.extra_draws, full.ensemble, full.student_epochs, full.student_decay) == \
        (400, "auto", 10, 1200, True)
    assert (full.draws(one_period=False), full.draws(one_period=True)) == (BUILT_IN_DRAWS, ONE_PERIOD_DRAWS) == (8, 16)
    assert load_config(overrides=["warm_start.extra_draws=5"]).warm_start.draws(one_period=True) == 5  # as given
    assert load_config().warm_start.sac_critic_updates == 2000


def test_normalised_advantages_need_two_steps_a_rollout():
    with pytest.raises(ConfigError, match=r"a2c.normalize_advantage needs a rollout of at least 2 steps .* got "
                                          r"n_steps 1: set a2c.n_steps to 2 or more"):
        load_config(overrides=["a2c.n_steps=1", "a2c.n_envs=1"])
    assert load_config(overrides=["a2c.n_steps=1", "a2c.n_envs=1", "a2c.normalize_advantage=false"]).a2c.n_steps == 1


@pytest.mark.parametrize("override, message", [
    ("schedule.weights.sac=-1",
     "config key 'schedule.weights.sac': input should be greater than or equal to 0; got -1"),
    ("schedule.weights={sac: 0, ppo: 0, a2c: 0}",
     "config key 'schedule.weights': every agent of the night has weight 0"),
    ("schedule.quick_timesteps.ppo=0", "config key 'schedule.quick_timesteps.ppo': input should be greater than or "
                                       "equal to 1; got 0"),
])
def test_schedule_weights_and_quick_steps_are_ranged(override, message):
    assert error_of(override).startswith(message)


def test_a_night_without_weights_for_some_agents_gives_them_one():
    cfg = load_config(overrides=["schedule.weights={sac: 0}", "schedule.agents=[sac, ppo]"])
    assert cfg.schedule.weights == {"sac": 0.0}  # ppo's missing weight is 1: the night has time to share
