"""Every shipped recipe loads and validates; overrides and bad keys behave."""

import pytest

from tangentlens.core.recipe import ExecutorSpec, builtin_recipes, load_recipe


def _refusal(make, *args, **kwargs) -> str:
    """The message of the ``ValueError`` that ``make(*args, **kwargs)`` raises."""
    with pytest.raises(ValueError) as error:
        make(*args, **kwargs)
    return str(error.value)


@pytest.mark.parametrize("name", sorted(builtin_recipes()))
def test_builtin_recipe_loads(name):
    recipe = load_recipe(name)
    assert recipe.name == name and recipe.probes
    assert recipe.to_dict()["suite"]["name"] == recipe.suite.name


def test_expected_recipes_ship():
    assert {
        "quickstart",
        "bernas2026",
        "razzhigaev2023",
        "godey2024",
        "mini_bert",
        "pythia_160m",
    } <= set(builtin_recipes())


def test_overrides_are_typed_and_checked():
    recipe = load_recipe("quickstart", ["proxies.rank=32", "suite.steps=log:3"])
    assert recipe.proxies.rank == 32 and recipe.suite.steps == "log:3"
    recipe = load_recipe("quickstart", ["proxies.methods=['pca']"])
    assert recipe.proxies.methods == ("pca",)
    with pytest.raises(ValueError, match=r"proxies\.rank must be an integer"):
        load_recipe("quickstart", ["proxies.rank='big'"])
    with pytest.raises(ValueError, match="did you mean 'data'"):
        load_recipe("quickstart", ["dta.seq_len=3"])
    with pytest.raises(ValueError, match="KEY=VALUE"):
        load_recipe("quickstart", ["rank"])
    with pytest.raises(ValueError, match=r"capture\.embed"):
        load_recipe("quickstart", ["capture.embed=false"])


def test_executor_table_is_read_and_checked(tmp_path):
    assert load_recipe("quickstart").executor == ExecutorSpec()
    path = tmp_path / "slurm.toml"
    path.write_text(
        (builtin_recipes()["quickstart"]).read_text(encoding="utf-8")
        + '\n[executor]\nkind = "slurm"\npartition = "gpu"\ngpus_per_unit = 1\nmemory_gb = 16\n'
        + '\n[executor.sbatch]\nqos = "high"\nnice = 10\n',
        encoding="utf-8",
    )
    executor = load_recipe(path).executor
    assert executor.kind == "slurm" and executor.partition == "gpu"
    assert executor.gpus_per_unit == 1.0 and isinstance(executor.gpus_per_unit, float)
    assert executor.sbatch == {"qos": "high", "nice": 10}
    recipe = load_recipe("quickstart", ["executor.workers=3", "executor.kind=ray"])
    assert recipe.executor.workers == 3 and recipe.executor.kind == "ray"
    assert load_recipe("quickstart", ["executor.sbatch.qos=low"]).executor.sbatch == {"qos": "low"}


@pytest.mark.parametrize(
    "override, message",
    [
        ("executor.kind=rey", r"executor\.kind must be one of .* \(did you mean 'ray'\?\)"),
        ("executor.workers=-1", r"executor\.workers must be an integer ≥ 0, got -1"),
        ("executor.retries=-1", r"executor\.retries must be an integer ≥ 0"),
        ("executor.cpus_per_unit=0", r"executor\.cpus_per_unit must be an integer ≥ 1"),
        ("executor.time_min=0", r"executor\.time_min must be an integer ≥ 1"),
        ("executor.gpus_per_unit=-0.5", r"executor\.gpus_per_unit must be a number in \[0"),
        ("executor.memory_gb='lots'", r"executor\.memory_gb must be a number"),
        ("executor.sbatch=3", r"executor\.sbatch must be a table"),
        ("executor.sbatch.exclusive=true", r"executor\.sbatch\.exclusive must be a string or"),
        ("executor.wokers=3", r"unknown key executor\.wokers.*did you mean 'workers'"),
        ("capture.threads=0", r"capture\.threads must be an integer ≥ 1"),
    ],
)
def test_bad_executor_and_thread_settings_name_the_key(override, message):
    with pytest.raises(ValueError, match=message):
        load_recipe("quickstart", [override])


def test_executor_is_not_part_of_the_recipe_identity():
    local = load_recipe("quickstart")
    slurm = load_recipe("quickstart", ["executor.kind=slurm", "executor.sbatch.qos=high"])
    assert "executor" not in slurm.to_dict()
    assert slurm.to_dict() == local.to_dict()  # a run started on Slurm resumes locally
    assert slurm.executor_dict()["kind"] == "slurm"
    assert slurm.executor_dict()["sbatch"] == {"qos": "high"}
    # the threads every unit pins change the reductions' order: they are part of it
    assert local.to_dict()["capture"]["threads"] == 2
    assert load_recipe("quickstart", ["capture.threads=4"]).to_dict() != local.to_dict()


def test_capture_layers_select_blocks_and_name_what_is_wrong():
    from tangentlens.core.recipe import select_layers

    assert select_layers("all", 4) == (0, 1, 2, 3)
    assert select_layers("every:4", 12) == (0, 4, 8)
    assert select_layers(" 11,0,6,6 ", 12) == (0, 6, 11)
    with pytest.raises(ValueError, match=r"names block\(s\) \[12\], but the model has 12 blocks"):
        select_layers("0,12", 12)
    for bad in ("every:0", "first", "1;2", ""):
        with pytest.raises(ValueError, match=r"capture\.layers: cannot read"):
            load_recipe("quickstart", [f"capture.layers='{bad}'"])
    assert load_recipe("quickstart", ["capture.layers='every:2'"]).capture.layers == "every:2"
    assert load_recipe("quickstart").to_dict()["capture"]["layers"] == "all"  # in the identity


@pytest.mark.parametrize("replicates", [1, 9])
def test_too_few_bootstrap_replicates_are_refused_with_the_recipe(replicates):
    """1–9 replicates used to pass validation and fail at run time, after the captures."""
    with pytest.raises(ValueError, match=r"bootstrap must be 0 \(no interval\) or ≥ 10"):
        load_recipe("quickstart", [f"probes.tangent_energy.bootstrap={replicates}"])
    assert load_recipe("quickstart", ["probes.tangent_energy.bootstrap=10"]).probes


@pytest.mark.parametrize("gpu", [True, False])
def test_the_suites_device_resolves_against_what_torch_sees(gpu, monkeypatch):
    import torch

    from tangentlens.core.recipe import SuiteSpec

    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpu)
    assert SuiteSpec(device="auto").resolved_device() == ("cuda" if gpu else "cpu")
    assert SuiteSpec(device="cpu").resolved_device() == "cpu"
    for device in ("cuda", "cuda:1"):
        if gpu:
            assert SuiteSpec(device=device).resolved_device() == device
            continue
        assert (
            _refusal(SuiteSpec(device=device).resolved_device)
            == f"suite.device = {device!r} but torch sees no CUDA device"
        )


def test_the_suites_settings_are_refused_with_a_suggestion():
    from tangentlens.core.recipe import SuiteSpec

    assert SuiteSpec(device="cuda:12").device == "cuda:12"
    for device in ("cuda:1:2", "cuda:x", "cpu:0", "cuda:"):
        with pytest.raises(ValueError, match=r"^suite\.device must be one of .* or 'cuda:N'"):
            SuiteSpec(device=device)
    cases = {"loader": "hookd", "dtype": "float23", "device": "cdua"}
    meant = {"loader": "hooked", "dtype": "float32", "device": "cuda"}
    for key, value in cases.items():
        with pytest.raises(ValueError, match=rf"got '{value}' \(did you mean '{meant[key]}'\?\)$"):
            SuiteSpec(**{key: value})


def test_the_suites_dtype_is_a_torch_dtype():
    import torch

    from tangentlens.core.recipe import WEIGHT_DTYPES, SuiteSpec

    for name in WEIGHT_DTYPES:
        assert SuiteSpec(dtype=name).torch_dtype() is getattr(torch, name)
    assert SuiteSpec(dtype="bfloat16").torch_dtype() is torch.bfloat16


def test_capture_layers_are_refused_naming_the_forms_and_the_blocks():
    from tangentlens.core.recipe import LAYER_FORMS, select_layers

    assert select_layers("every:2", 5) == (0, 2, 4) and select_layers("3,0", 4) == (0, 3)
    assert _refusal(select_layers, "every:0", 4) == (
        f"capture.layers: cannot read 'every:0'; allowed: {', '.join(LAYER_FORMS)}"
    )
    assert _refusal(select_layers, "0,4", 4) == (
        "capture.layers names block(s) [4], but the model has 4 blocks (0 … 3)"
    )


def test_site_groups_are_contiguous_and_differ_by_at_most_one():
    from tangentlens.core.recipe import site_groups

    sites = list("abcdefg")
    assert site_groups(sites, 3) == [list("abc"), list("de"), list("fg")]
    assert site_groups(sites, 2) == [list("abcd"), list("efg")]
    assert site_groups(sites, 0) == site_groups(sites, 1) == [sites]
    assert site_groups(sites, 9) == [[s] for s in sites]  # at most one group per site


def test_the_capture_and_executor_refusals_say_what_is_allowed():
    from tangentlens.core.recipe import CAPTURE_SITE_KINDS, CaptureSpec, ExecutorSpec

    assert _refusal(CaptureSpec, sites=("resid_pots",)) == (
        f"capture.sites: unknown site kind 'resid_pots'; allowed: {CAPTURE_SITE_KINDS} "
        "(did you mean 'resid_post'?)"
    )
    assert _refusal(CaptureSpec, reduction="mean") == (
        "capture.reduction must be 'sum', got 'mean' ('mean' was removed: dividing each batch "
        "by its own token count reweighted tokens across batches)"
    )
    with pytest.raises(ValueError, match=r"^capture\.precision must be one of"):
        CaptureSpec(precision="float16")
    assert (
        _refusal(ExecutorSpec, sbatch=["--gres=gpu:1"])
        == "executor.sbatch must be a table, got ['--gres=gpu:1']"
    )


@pytest.mark.parametrize(
    "override, message",
    [
        ("data.seq_len.x=3", "--set data.seq_len.x: 'seq_len' is not a table"),
        ("proxies..rank=3", "--set proxies..rank: an empty key part (e.g. proxies.rank=32)"),
        (
            "probes.tangent_energy.bootstrap=-1",
            "probes.tangent_energy.bootstrap must be an integer ≥ 0, got -1",
        ),
    ],
)
def test_a_set_key_is_refused_naming_it(override, message):
    assert _refusal(load_recipe, "quickstart", [override]) == message


def test_a_recipe_that_cannot_be_read_is_refused_in_one_line(tmp_path):
    unknown = _refusal(load_recipe, "quikstart")
    assert unknown.startswith("unknown recipe 'quikstart': not a built-in (['")
    assert unknown.endswith("]) nor a TOML file (did you mean 'quickstart'?)")
    bad = tmp_path / "bad.toml"
    bad.write_text("[suite\nname = 1\n")
    with pytest.raises(ValueError, match=rf"^recipe {bad} is not valid TOML: Expected"):
        load_recipe(bad)
    bad.write_text("probes = 3\n")  # was an AttributeError in the legacy-key migration
    assert _refusal(load_recipe, bad) == "probes must be a table of probe tables"
    bad.write_text('[suite]\nname = "micro-pythia"\n')
    with pytest.raises(ValueError, match=r"^the recipe enables no probe; allowed: \["):
        load_recipe(bad)


def test_a_probes_recipe_check_is_handed_its_own_config_and_the_recipe():
    """A user probe whose check reads its settings is refused on them, not on defaults."""
    from tangentlens.core.recipe import Recipe
    from tangentlens.registry import ProbeEntry
    from tests.unit.test_contract import Settings, _probe

    def recipe_check(config, recipe):
        if config.scale > recipe.capture.reservoir:
            raise ValueError(f"probes.mine.scale {config.scale} is over capture.reservoir")

    probe = _probe(recipe_check=recipe_check)
    fits = Recipe("mine", probes={"mine": ProbeEntry("mine", probe, Settings(scale=0.5))})
    assert fits.config("mine") == Settings(scale=0.5)
    big = fits.capture.reservoir + 1.0
    entry = ProbeEntry("mine", probe, Settings(scale=big))
    message = _refusal(Recipe, "mine", probes={"mine": entry})
    assert message == f"probes.mine.scale {big} is over capture.reservoir"


@pytest.mark.parametrize(
    "section, line, message",
    [
        ("data", "batch_sise = 3", "unknown key data.batch_sise; allowed: ['corpus', 'seq_len',"),
        ("data", "seq_len = 'long'", "data.seq_len must be an integer, got 'long'"),
        ("capture", "reservior = 3", "unknown key capture.reservior; allowed: ['sites', 'layers',"),
        ("capture", "reservoir = -1", "capture.reservoir must be an integer ≥ 0, got -1"),
    ],
)
def test_a_recipe_files_section_refusal_names_its_section(tmp_path, section, line, message):
    path = tmp_path / "mine.toml"
    path.write_text(f"[{section}]\n{line}\n[probes.cosine_drift]\n")
    assert _refusal(load_recipe, path).startswith(message)
