"""The launch: every run folder `write_run` writes starts as verl 0.9.1 would start it.
launch.sh (and sft.sh) run under bash with a stand-in interpreter; what they pass is
composed with verl's own trainer config (Hydra refuses an unknown key that is not added
with '+'), checked by verl's validate_config and config dataclasses, and checked against
the model's config as verl's workers and vLLM read it. The presets are the papers', and
every refusal leaves nothing behind."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from packs.registry import Pack, load_pack
from rl.config import (
    AGENT_LOOP_CONFIG,
    AGENT_LOOP_MANAGER,
    LOGGERS,
    PRESETS,
    PROMPT_TOKENS,
    STORE_ENV,
    agent_workers,
    overrides,
    rollout_tp,
    sft_overrides,
    write_run,
)
from rl.contract import AGENT_NAME
from rl.errors import RLError
from rl.model_config import MAX_YARN_FACTOR, ModelConfig, read_model_config, yarn_for
from tests.support.launch_harness import (
    LONG,
    MOE_VISION,
    ROPE_SCALED,
    SHORT,
    composed,
    datasets,
    model_checks,
    run_script,
    sft_file,
    trainer_words,
    verl_checks,
)

STORE = "postgresql://u@db.example/worlds"


@pytest.fixture(scope="module")
def pack() -> Pack:
    return load_pack("demo")


def _write(tmp_path: Path, pack: Pack, preset: str, **kw: Any) -> Path:
    train, val = datasets(tmp_path, preset)
    out = tmp_path / f"run-{preset}"
    options: dict[str, Any] = {"preset_name": preset, "model": str(LONG), "n_gpus": 8,
                               "store": STORE, "train_file": train, "val_file": val}
    if PRESETS[preset].sft_epochs:
        options["no_sft"] = True
    options.update(kw)
    write_run(out, pack, **options)
    return out


def test_an_unknown_key_is_refused_so_the_check_means_something() -> None:
    from hydra.errors import ConfigCompositionException

    with pytest.raises(ConfigCompositionException, match="Could not override"):
        composed(["actor_rollout_ref.rollout.no_such_key=1"])


@pytest.mark.parametrize("preset", list(PRESETS))
@pytest.mark.parametrize(("n_gpus", "tp"), [(1, 1), (3, 1), (8, 2)])
@pytest.mark.parametrize("model", [LONG, SHORT], ids=["long-context", "short-context"])
def test_every_launch_starts_in_verl_and_fits_the_model(pack: Pack, tmp_path: Path, preset: str,
                                                        n_gpus: int, tp: int,
                                                        model: Path) -> None:
    # the short model (4,096 positions) takes an 8,192-token context through YaRN
    context = 8192 if model == SHORT else None
    run = _write(tmp_path, pack, preset, model=str(model), n_gpus=n_gpus, context=context,
                 loggers=("console", "tensorboard"))
    (call,) = run_script(run)
    cfg = composed(trainer_words(call))
    verl_checks(cfg)
    hf_config = model_checks(cfg, model, run)
    chosen = PRESETS[preset]
    size = context or chosen.context
    rollout, actor = cfg.actor_rollout_ref.rollout, cfg.actor_rollout_ref.actor
    # paths are the run folder's; the model is run.env's, expanded by the shell
    assert (cfg.data.train_files, cfg.data.val_files) == ("train.parquet", "val.parquet")
    assert cfg.actor_rollout_ref.model.path == str(model)
    assert rollout.agent.agent_loop_config_path == "agent_loop.yaml"
    assert (run / "agent_loop.yaml").read_bytes() == AGENT_LOOP_CONFIG.read_bytes()
    assert cfg.trainer.default_local_dir == "checkpoints"
    # a launch that starts: V1, a tensor-parallel size dividing the GPUs, workers
    # dividing the batch (the demo's 3 tasks)
    assert (cfg.trainer.use_v1, cfg.trainer.v1.trainer_mode) == (True, "sync")
    assert rollout.agent.agent_loop_manager_class == AGENT_LOOP_MANAGER
    assert rollout.tensor_model_parallel_size == tp and n_gpus % tp == 0
    assert cfg.data.train_batch_size == 3 == actor.ppo_mini_batch_size
    assert cfg.data.train_batch_size % rollout.agent.num_workers == 0
    assert (cfg.trainer.nnodes, cfg.trainer.n_gpus_per_node) == (1, n_gpus)
    # checkpoints, validation, resume, trackers
    assert (cfg.trainer.save_freq, cfg.trainer.test_freq, cfg.trainer.resume_mode) == (
        8, 8, "auto")
    assert list(cfg.trainer.logger) == ["console", "tensorboard"]
    # the context, and YaRN exactly when the model needs it
    assert rollout.max_model_len == size == cfg.data.max_prompt_length + \
        cfg.data.max_response_length
    yarn = hf_config.rope_parameters if context else None
    assert (cfg.actor_rollout_ref.model.hf_config_path is not None) is (yarn is not None)
    if yarn is not None:
        assert yarn["rope_type"] == "yarn" and yarn["factor"] == 2.0
        assert yarn["original_max_position_embeddings"] == 4096
        assert yarn["rope_theta"] == 1_000_000
        assert hf_config.max_position_embeddings == 8192
    # the agent loop's settings
    loop = dict(cfg.agent_worlds)
    assert loop == {**dict(chosen.loop), **({"compact_at": int(size * 0.75)}
                                            if chosen.compacts else {}),
                    "format_penalty": True,
                    **({"partial_credit": True} if preset == "wildawm" else {})}
    assert "store" not in loop  # run.env's WORLDCTL_STORE: the machine's
    assert f"{STORE_ENV}={shlex.quote(STORE)}" in (run / "run.env").read_text()


def test_the_presets_are_the_papers(pack: Pack, tmp_path: Path) -> None:
    wild, awm = PRESETS["wildawm"], PRESETS["awm"]
    # WildAWM (methods.md 6): 8 tasks x G = 4, <= 64 RL steps, clip 0.2 / 0.28, entropy
    # 0.001, no KL, 102,400 tokens compacted, 256 steps and 30 minutes a rollout, retried
    # 3 times, an SFT warm start of 3 epochs; adaptive rollouts, C = 8, kappa_max = 3
    assert (wild.tasks_per_step, wild.rollouts_per_task, wild.training_steps) == (8, 4, 64)
    assert (wild.clip_low, wild.clip_high, wild.entropy_coeff, wild.use_kl_loss) == (
        0.2, 0.28, 0.001, False)
    assert (wild.context, wild.max_steps, wild.sft_epochs) == (102_400, 256, 3)
    assert (wild.adv_estimator, wild.loss_mode, wild.reward, wild.mode) == (
        "wildawm", "wildawm_grpo", "wildawm", "tools")
    assert {k: v for k, v in wild.loop if k in (
        "adaptive", "history", "samples", "max_steps", "rollout_timeout", "retries", "block",
        "kappa_max")} == {"adaptive": True, "history": "compaction", "samples": "segments",
                          "max_steps": 256, "rollout_timeout": 1800, "retries": 3,
                          "block": 8, "kappa_max": 3}
    # AWM (methods.md 3): 64 x 16, <= 96 steps, <= 20 turns, 131,072 tokens, lr 7e-7,
    # KL 0.001, clip 0.28, entropy 0, sequence-level IS, GRPO; the window of 3 turns
    assert (awm.tasks_per_step, awm.rollouts_per_task, awm.training_steps, awm.max_steps,
            awm.context) == (64, 16, 96, 20, 131_072)
    assert (awm.lr, awm.use_kl_loss, awm.kl_coef, awm.clip_low, awm.clip_high,
            awm.entropy_coeff) == (7e-7, True, 0.001, 0.28, 0.28, 0.0)
    assert (awm.adv_estimator, awm.rollout_is, awm.reward, awm.mode, awm.sft_epochs) == (
        "grpo", "sequence", "awm", "meta", 0)
    assert dict(awm.val_sampling) == {"do_sample": True, "temperature": 0.6, "top_k": 20,
                                      "top_p": 0.95}
    assert {k: v for k, v in awm.loop if k in ("adaptive", "history", "window", "samples",
                                                "max_steps")} == {
        "adaptive": False, "history": "window", "window": 3, "samples": "history",
        "max_steps": 20}
    # ... and land in verl's config where verl reads them
    for name in PRESETS:
        (call,) = run_script(_write(tmp_path / name, pack, name))
        cfg = composed(trainer_words(call))
        chosen, actor = PRESETS[name], cfg.actor_rollout_ref.actor
        assert cfg.trainer.total_training_steps == chosen.training_steps
        assert cfg.trainer.total_epochs >= chosen.training_steps  # epochs never stop it early
        assert actor.optim.lr == chosen.lr and actor.kl_loss_coef == chosen.kl_coef
        assert (actor.clip_ratio_low, actor.clip_ratio_high) == (chosen.clip_low,
                                                                 chosen.clip_high)
        assert actor.entropy_coeff == chosen.entropy_coeff
        assert actor.use_kl_loss is chosen.use_kl_loss
        assert actor.policy_loss.loss_mode == chosen.loss_mode
        assert cfg.algorithm.adv_estimator == chosen.adv_estimator
        assert cfg.algorithm.rollout_correction.rollout_is == chosen.rollout_is
        assert cfg.actor_rollout_ref.rollout.n == chosen.rollouts_per_task
        assert cfg.actor_rollout_ref.rollout.multi_turn.max_assistant_turns == chosen.max_steps
        assert cfg.actor_rollout_ref.rollout.agent.default_agent_loop == AGENT_NAME
        for key, value in chosen.val_sampling:
            assert cfg.actor_rollout_ref.rollout.val_kwargs[key] == value
    import rl.loss

    assert (PRESETS["wildawm"].adv_estimator, PRESETS["wildawm"].loss_mode) == (
        rl.loss.ADV_ESTIMATOR, rl.loss.POLICY_LOSS)


def test_the_sft_warm_start_runs_first_once_and_rl_starts_from_it(pack: Pack,
                                                                  tmp_path: Path) -> None:
    run = _write(tmp_path, pack, "wildawm", model=str(SHORT), n_gpus=2, context=8192,
                 no_sft=False, sft_file=sft_file(tmp_path, rows=20))
    assert (run / "sft.parquet").is_file() and (run / "sft.sh").stat().st_mode & 0o111
    sft_call, rl_call = run_script(run)
    assert sft_call[:6] == ["-m", "torch.distributed.run", "--standalone",
                            "--nproc_per_node=2", "-m", "verl.trainer.sft_trainer"]
    sft = composed(sft_call[6:], "sft_trainer_engine")
    assert sft.trainer.total_epochs == 3 and sft.model.path == str(SHORT)
    assert sft.data.train_files == "sft.parquet"
    assert sft.data.train_batch_size == 16 and sft.data.train_batch_size % 2 == 0
    assert sft.data.max_length == 8192 <= sft.data.max_token_len_per_gpu
    assert sft.model.hf_config_path == "model_config"  # the same YaRN as the RL stage
    assert "hf_model" in sft.checkpoint.save_contents
    assert (sft.trainer.resume_mode, sft.trainer.default_local_dir) == ("auto",
                                                                       "sft/checkpoints")
    assert sft.optim.lr == 1e-5
    # sft.sh links the last checkpoint's Hugging Face model; RL starts from it
    assert (run / "sft" / "model").resolve() == (
        run / "sft" / "checkpoints" / "global_step_10" / "huggingface").resolve()
    assert not (run / "sft" / "model").readlink().is_absolute()
    cfg = composed(trainer_words(rl_call))
    verl_checks(cfg)
    assert cfg.actor_rollout_ref.model.path == "sft/model"
    assert cfg.trainer.experiment_name == "demo-wildawm"
    # a second launch (a resume) does not warm-start again
    assert [c[:2] for c in run_script(run)[2:]] == [["-m", "verl.trainer.main_ppo"]]


def test_the_ablation_switches(pack: Pack, tmp_path: Path) -> None:
    run = _write(tmp_path, pack, "wildawm", format_penalty=False, partial_credit=False)
    (call,) = run_script(run)
    cfg = composed(trainer_words(call))
    assert (cfg.agent_worlds.format_penalty, cfg.agent_worlds.partial_credit) == (False, False)
    assert cfg.trainer.experiment_name == "demo-wildawm-no-sft-no-format-penalty-" \
        "no-partial-credit"
    assert cfg.actor_rollout_ref.model.path == str(LONG)  # no warm start: run.env's model
    awm = _write(tmp_path, pack, "awm", format_penalty=False)
    cfg = composed(trainer_words(run_script(awm)[0]))
    assert cfg.agent_worlds.format_penalty is False and "partial_credit" not in cfg.agent_worlds


def test_yarn_is_the_factor_the_context_needs() -> None:
    qwen3_8b = ModelConfig(model="Qwen/Qwen3-8B", file=Path("config.json"), raw={},
                           max_position_embeddings=40_960, nested=False, rope=None,
                           rope_theta=1e6, experts=0, vision=False)
    for context, factor in ((102_400, 2.5), (131_072, 3.2)):
        yarn = yarn_for(qwen3_8b, context)
        assert yarn is not None and yarn.factor == factor
        # vLLM's limit (original x factor, truncated) is never a token short
        assert int(yarn.original * yarn.factor) >= context
        assert yarn.hf_overrides() == {"max_position_embeddings": context, "rope_parameters": {
            "rope_type": "yarn", "factor": factor, "original_max_position_embeddings": 40_960,
            "rope_theta": 1e6}}
    assert yarn_for(qwen3_8b, 40_960) is None
    odd = yarn_for(read_model_config(str(SHORT)), 4096 * 3 + 1)
    assert odd is not None and int(odd.original * odd.factor) >= 4096 * 3 + 1


def test_transformers_takes_the_yarn_config(pack: Pack, tmp_path: Path) -> None:
    from transformers import AutoConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    run = _write(tmp_path, pack, "wildawm", model=str(SHORT), context=8192)
    config = AutoConfig.from_pretrained(str(run / "model_config"))
    inv_freq, attention_factor = ROPE_INIT_FUNCTIONS["yarn"](config, "cpu")
    assert inv_freq.shape == (16,) and attention_factor > 1.0


@pytest.mark.parametrize(("model", "context", "kw", "says"), [
    (SHORT, 102_400, {}, "factor of 25.00, over 4"),
    (SHORT, 8192, {"rope_scaling": False}, "--no-rope-scaling refuses YaRN"),
    (ROPE_SCALED, 16_384, {}, "'llama3' rope scaling already"),
    (LONG, PROMPT_TOKENS, {"prompt_tokens": PROMPT_TOKENS}, "leaves no room for the rollout"),
    (LONG, None, {"tensor_parallel": 3}, "tensor-parallel size of 3 does not divide the 8"),
])
def test_a_launch_that_cannot_start_is_refused_and_writes_nothing(
        pack: Pack, tmp_path: Path, model: Path, context: int | None, kw: dict[str, Any],
        says: str) -> None:
    with pytest.raises(RLError, match=says):
        _write(tmp_path, pack, "wildawm", model=str(model), context=context, **kw)
    assert sorted(p.name for p in tmp_path.iterdir() if p.suffix != ".parquet") == []
    assert MAX_YARN_FACTOR == 4.0


def test_refused_inputs_write_nothing(pack: Pack, tmp_path: Path) -> None:
    train, val = datasets(tmp_path, "wildawm")
    awm_train, awm_val = datasets(tmp_path, "awm")
    tools_awm, _ = datasets(tmp_path, "awm", mode="tools")
    leaky, _ = datasets(tmp_path, "wildawm", train_split="eval")
    out = tmp_path / "run"
    (tmp_path / "notes.txt").write_text("not parquet")
    base: dict[str, Any] = {"model": str(LONG), "store": STORE, "train_file": train,
                            "val_file": val, "no_sft": True}
    cases: list[tuple[dict[str, Any], str]] = [
        ({"train_file": tmp_path / "nope.parquet"}, r"--train .*nope.parquet: no such file"),
        ({"val_file": tmp_path / "nope" / "val.parquet"}, "--val .*: no such file"),
        ({"val_file": tmp_path / "notes.txt"}, "--val .*notes.txt: not a parquet file"),
        ({"train_file": awm_train}, "rows have reward 'awm', the wildawm preset needs "
                                    "'wildawm'.*--mode tools --reward wildawm"),
        ({"train_file": leaky}, "'nordlys-delivery-checklist' is of the eval split"),
        ({"preset_name": "awm", "train_file": tools_awm, "no_sft": False},
         "rows have mode 'tools', the awm preset needs 'meta'"),
        ({"no_sft": False}, "warm-starts with 3 epochs of SFT: give --sft FILE"),
        ({"sft_file": tmp_path / "none.parquet"}, "--sft and --no-sft"),
        ({"no_sft": False, "sft_file": tmp_path / "none.parquet"}, "--sft .*: no such file"),
        ({"no_sft": False, "sft_file": train}, "not a file of `worldctl rl sft`"),
        ({"no_sft": False, "sft_file": sft_file(tmp_path, rows=3)},
         "3 conversation\\(s\\) for 8 GPUs"),
        ({"preset_name": "awm", "no_sft": False, "sft_file": sft_file(tmp_path)},
         "awm preset has no SFT warm start"),
        ({"model": str(tmp_path / "no-model")}, "no such folder, and not a Hugging Face id"),
        ({"model": str(tmp_path)}, "the folder has no config.json"),
        ({"partial_credit": False, "preset_name": "awm", "train_file": awm_train,
          "val_file": awm_val},
         "the awm reward has none"),
        ({"loggers": ("console", "neptune")}, "logger neptune"),
    ]
    for change, says in cases:
        with pytest.raises(RLError, match=says):
            write_run(out, pack, **{**base, **change})
        assert not out.exists(), change
        assert not [p for p in tmp_path.iterdir() if p.name.startswith(".run")], change
    out.mkdir()
    (out / "checkpoints").mkdir()
    with pytest.raises(RLError, match="exists and is not empty"):
        write_run(out, pack, **base)
    assert [p.name for p in out.iterdir()] == ["checkpoints"]
    (out / "checkpoints").rmdir()
    write_run(out, pack, **base)  # an empty folder is taken
    assert (out / "launch.sh").is_file()


def test_a_hub_id_is_read_from_the_local_cache_only(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(RLError, match=r"'tiny/qwen'.* not in the Hugging Face cache "
                                      r"\(.*hub\): download the model first"):
        read_model_config("tiny/qwen")
    repo = tmp_path / "hub" / "models--tiny--qwen"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("abc123\n")
    (repo / "snapshots" / "abc123").mkdir(parents=True)
    (repo / "snapshots" / "abc123" / "config.json").write_text((SHORT / "config.json")
                                                               .read_text())
    found = read_model_config("tiny/qwen")
    assert found.max_position_embeddings == 4096 and found.file.parent.name == "abc123"
    monkeypatch.delenv("HF_HUB_CACHE")
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    assert read_model_config("tiny/qwen").file == found.file


def test_model_notes_say_what_verl_cannot_freeze(pack: Pack, tmp_path: Path) -> None:
    found = read_model_config(str(MOE_VISION))
    assert (found.experts, found.vision) == (8, True)
    run = _write(tmp_path, pack, "wildawm", model=str(MOE_VISION))
    text = (run / "launch.sh").read_text()
    assert "# Note: the model has 8 experts" in text and "no switch for it" in text
    assert "# Note: the vision encoder" in text
    assert read_model_config(str(LONG)).rope_theta == 5_000_000
    gemma = ModelConfig(model="g", file=Path("config.json"), raw={}, max_position_embeddings=8,
                        nested=False, rope={"full_attention": {"rope_type": "default"}},
                        rope_theta=None, experts=0, vision=False)
    with pytest.raises(RLError, match="'per-layer' rope scaling already"):
        yarn_for(gemma, 16)


def test_a_run_folder_is_the_same_bytes_every_time(pack: Pack, tmp_path: Path) -> None:
    first = _write(tmp_path / "a", pack, "wildawm", model=str(SHORT), context=8192)
    second = _write(tmp_path / "b", pack, "wildawm", model=str(SHORT), context=8192)
    names = sorted(p.relative_to(first).as_posix() for p in first.rglob("*") if p.is_file())
    assert names == ["agent_loop.yaml", "launch.sh", "model_config/config.json", "run.env",
                     "train.parquet", "val.parquet"]
    for name in names:
        if name.endswith(".parquet"):
            continue  # copies of each test's own files
        assert (first / name).read_bytes() == (second / name).read_bytes(), name
    env = (first / "run.env").read_text()
    assert f"MODEL={SHORT}" in env and "PYTHON=" in env
    launch = (first / "launch.sh").read_text()
    assert str(tmp_path) not in launch and str(SHORT) not in launch  # no machine paths
    assert "# run.env's MODEL was checked (YaRN factor 2: 4,096 -> 8,192 tokens)." in launch
    assert json.loads((first / "model_config" / "config.json").read_text())[
        "max_position_embeddings"] == 8192


def test_library_overrides_take_smaller_sizes(pack: Pack) -> None:
    """What a CPU run builds on: the preset at a 5k context on one GPU."""
    items = overrides(pack, model="/m", n_gpus=1, context=5120, prompt_tokens=4096,
                      store="/s", packs_dir="/p")
    cfg = composed(items)
    verl_checks(cfg)
    assert (cfg.data.max_prompt_length, cfg.data.max_response_length) == (4096, 1024)
    assert cfg.actor_rollout_ref.rollout.max_model_len == 5120
    assert cfg.agent_worlds.compact_at == 3840
    assert (cfg.agent_worlds.store, cfg.agent_worlds.packs_dir) == ("/s", "/p")
    assert cfg.actor_rollout_ref.rollout.agent.agent_loop_config_path == str(AGENT_LOOP_CONFIG)
    with pytest.raises(RLError, match="no preset 'ppo'"):
        overrides(pack, preset_name="ppo")
    with pytest.raises(RLError, match="at least 1"):
        overrides(pack, n_gpus=0)
    with pytest.raises(RLError, match="split 'train' of pack 'demo' has no tasks"):
        overrides(pack, split="train")


def test_workers_divide_the_batch_and_tp_divides_the_gpus() -> None:
    assert [agent_workers(b) for b in (1, 3, 8, 12, 64)] == [1, 3, 8, 6, 8]
    assert [rollout_tp(n) for n in (1, 2, 3, 8)] == [1, 2, 1, 2]
    assert rollout_tp(8, 4) == 4


def test_the_loggers_are_verls() -> None:
    from verl.utils.tracking import Tracking

    assert set(LOGGERS) == set(Tracking.supported_backend)


def test_the_sft_overrides_exist_in_verls_sft_config(tmp_path: Path) -> None:
    items = sft_overrides(tmp_path / "sft.parquet", model="Qwen/Qwen3-4B", n_gpus=4, rows=10)
    cfg = composed(items, "sft_trainer_engine")
    assert cfg.data.train_files == str(tmp_path / "sft.parquet")
    assert (cfg.data.custom_cls.path, cfg.data.custom_cls.name) == ("pkg://rl.sft",
                                                                    "WorldSFTDataset")
    assert (cfg.data.messages_key, cfg.data.tools_key) == ("messages", "tools")
    assert cfg.data.train_batch_size == 8  # 10 rows: whole steps of one per GPU each
    assert cfg.model.path == "Qwen/Qwen3-4B"


def test_the_agent_loop_file_registers_our_loop() -> None:
    assert yaml.safe_load(AGENT_LOOP_CONFIG.read_text()) == [
        {"name": AGENT_NAME, "_target_": "rl.verl_loop.WorldAgentLoop"}]


@pytest.mark.parametrize("preset", list(PRESETS))
def test_the_loop_accepts_our_settings(pack: Pack, preset: str) -> None:
    """What we put under agent_worlds.* is what rl.verl_loop reads (it refuses the rest)."""
    from rl.verl_loop import LoopSettings
    from rl.world import STORE_ENV as LOOP_STORE_ENV

    assert STORE_ENV == LOOP_STORE_ENV
    ours = {i.split("=", 1)[0].removeprefix("+agent_worlds."): i.split("=", 1)[1]
            for i in overrides(pack, preset_name=preset, store="/s", packs_dir="/p")
            if "agent_worlds." in i}
    settings = LoopSettings.read(ours)
    assert settings.store == "/s" and settings.max_steps == PRESETS[preset].max_steps
    assert settings.history == dict(PRESETS[preset].loop)["history"]
