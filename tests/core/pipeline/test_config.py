import pytest
from pydantic import ValidationError

from ance_core.errors import AnceError, AnceWarning
from ance_core.pipeline.config import PipelineConfig
from ance_core.pipeline.loading import load_config
from ance_core.training.config import TrainConfig


def test_typos_and_bad_values_are_refused():
    with pytest.raises(ValidationError, match="learning_rat"):
        TrainConfig(learning_rat=1e-5)
    with pytest.raises(ValidationError, match="greater than 0"):
        TrainConfig(learning_rate=0)
    with pytest.raises(ValidationError, match="training on the evaluation split"):
        PipelineConfig(data={"train_split": "test"})
    with pytest.raises(ValidationError):
        PipelineConfig().rounds = 3  # frozen
    # a process with no query of the micro-batch would train nothing (every step a no-op)
    with pytest.raises(ValidationError, match="batch_size 2 is below world_size 4"):
        PipelineConfig(ance={"batch_size": 2, "world_size": 4})
    assert TrainConfig(batch_size=4, world_size=4).world_size == 4


def test_load_config_names_file_and_field(tmp_path):
    good = tmp_path / "good.yaml"
    good.write_text("rounds: 1\nwarmup:\n  max_steps: 5\n")
    cfg = load_config(good)
    assert cfg.rounds == 1 and cfg.warmup.max_steps == 5 and cfg.ance.max_steps is None
    bad = tmp_path / "bad.yaml"
    bad.write_text("warmup:\n  batch_size: -1\nmodel:\n  pooling: max\n")
    with pytest.raises(AnceError) as err:
        load_config(bad)
    assert "bad.yaml" in str(err.value) and "warmup.batch_size" in str(err.value) and "model.pooling" in str(err.value)
    with pytest.raises(AnceError, match="not valid YAML"):
        (tmp_path / "broken.yaml").write_text("a: [1\n")
        load_config(tmp_path / "broken.yaml")
    (tmp_path / "empty.yaml").write_text("# to fill in\n")  # the defaults, said (the wrong file saved, or none yet)
    with pytest.warns(AnceWarning, match=r"empty.yaml: an empty config file: every setting is the default"):
        assert load_config(tmp_path / "empty.yaml") == load_config(None)
    with pytest.raises(AnceError, match="config file not found"):
        load_config(tmp_path / "missing.yaml")
    with pytest.raises(AnceError, match="a folder, not a config file"):  # ("config file not found" before)
        load_config(tmp_path)
    (tmp_path / "indent.yaml").write_text("warmup:\n  epochs: 1\n   batch_size: 4\n")
    with pytest.raises(AnceError) as err:  # (PyYAML's seven lines, 'in "<unicode string>"', before)
        load_config(tmp_path / "indent.yaml")
    assert str(err.value).startswith(f"{tmp_path / 'indent.yaml'}:3:") and "\n" not in str(err.value)


def test_a_section_set_in_part_keeps_its_other_defaults(tmp_path):
    """The warm-up's negatives default to BM25: setting only their count must not switch them to another sampler."""
    path = tmp_path / "c.yaml"
    path.write_text("bm25_negatives: {num_negatives: 2}\nmining: {num_negatives: 3}\n")
    cfg = load_config(path)
    assert (cfg.bm25_negatives.sampler, cfg.bm25_negatives.num_negatives) == ("bm25", 2)
    assert (cfg.mining.sampler, cfg.mining.num_negatives) == ("ance", 3)


def test_dev_split_and_graded_positives_settings_are_checked():
    with pytest.raises(ValidationError, match="model selection on the training queries"):
        PipelineConfig(data={"dev_split": "train"})
    with pytest.raises(ValidationError, match="train_min_relevance must be 'auto' or a grade >= 1"):
        PipelineConfig(data={"train_min_relevance": 0})
    with pytest.raises(ValidationError, match="less than 1"):
        PipelineConfig(data={"dev_fraction": 1.0})
    assert PipelineConfig(refresh="async", max_staleness=2).schedule == "continuous"  # the async rounds: one run
    # a partial stage section keeps that stage's own defaults (the rounds train 2 epochs, the warm-up 1)
    config = PipelineConfig(ance={"learning_rate": 3e-5}, warmup={"seed": 1})
    assert (config.ance.epochs, config.warmup.epochs, config.ance.attention_dropout) == (2, 1, 0.0)
    with pytest.raises(ValidationError, match="the evaluation split would choose the run's result"):
        PipelineConfig(data={"eval_split": "dev"})  # e.g. MS MARCO's dev: name the dev split otherwise
    assert PipelineConfig(data={"eval_split": "dev", "dev_split": "train-dev"}).data.dev_split == "train-dev"
    # selection cv carves two or more disjoint dev folds, and runs each itself
    assert PipelineConfig(selection="cv", data={"dev_fraction": 0.3}).selection == "cv"
    for data, match in (({"dev_fraction": 0.6}, "data.dev_fraction is 0.6 .0.5 or less"),
                        ({"dev_fraction": 0.0}, "data.dev_fraction is 0.0"),
                        ({"dev_split": None}, "and data.dev_split is null"),
                        ({"dev_fold": 1}, "selection cv runs every dev fold itself; data.dev_fold 1: leave it 0")):
        with pytest.raises(ValidationError, match=match):
            PipelineConfig(selection="cv", data=data)
    with pytest.raises(ValidationError, match="selection cv with start_checkpoint /m: a model trained before"):
        PipelineConfig(selection="cv", start_checkpoint="/m")
    for data, match in (({"dev_fold": 1, "dev_fraction": 0}, "dev_fold 1 .* there is none .dev_fraction is 0."),
                        ({"dev_fold": 1, "dev_split": None}, "there is none .dev_split is null.")):
        with pytest.raises(ValidationError, match=match):
            PipelineConfig(data=data)


def test_maxp_settings_that_would_not_work_are_refused():
    maxp = {"document_mode": "maxp", "passage_max_length": 256}
    with pytest.raises(ValidationError, match="maxp trains on whole windows .* warmup.passage_max_length is 128"):
        PipelineConfig(model=maxp, warmup={"passage_max_length": 128}, ance={"passage_max_length": None})
    with pytest.raises(ValidationError, match="cannot tell each document's best window"):
        PipelineConfig(model=maxp, warmup={"passage_max_length": None}, ance={"passage_max_length": None},
                       mining={"sampler": "bm25"})
    with pytest.raises(ValidationError, match="compression of a maxp model"):
        PipelineConfig(model=maxp, warmup={"passage_max_length": None}, ance={"passage_max_length": None},
                       compression={})
    ok = PipelineConfig(model=maxp, warmup={"passage_max_length": None}, ance={"passage_max_length": None})
    assert ok.model.document_mode == "maxp"


def test_recipes_are_valid_pipeline_configs():
    from ance_core.pipeline.recipes import RECIPES, recipe_config

    assert recipe_config("demo") == PipelineConfig(mining={"sampler": "simans"},
                                                   warmup={"learning_rate": 4e-5, "hidden_dropout": 0.0},
                                                   ance={"learning_rate": 4e-5, "hidden_dropout": 0.0})
    for name in RECIPES:
        assert recipe_config(name, work_dir="elsewhere").work_dir == "elsewhere"


def test_a_deployment_inferencer_needs_the_async_refresh_and_a_server():
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from tasks.inferencer import check_deployment

    with pytest.raises(ValidationError, match="inferencer.mode 'deployment' runs the refreshes of refresh: async"):
        PipelineConfig(inferencer={"mode": "deployment"})
    config = PipelineConfig(refresh="async", inferencer={"mode": "deployment", "deployment": "refresh-negatives/x"})
    with temporary_settings(restore_defaults={PREFECT_API_URL}), pytest.raises(AnceError, match="PREFECT_API_URL is "
                                                                                 "unset"):  # an ephemeral server
        check_deployment(config.inferencer)
    check_deployment(PipelineConfig(refresh="async").inferencer)  # the thread needs nothing


def test_the_async_refresh_refuses_a_query_sample_drawn_again_each_round():
    """The async trainer swaps the negatives of its first round's rows: another round's sample has other rows."""
    with pytest.raises(ValidationError, match=r"mining.queries \(1000\) draws other training queries each round"):
        PipelineConfig(refresh="async", rounds=2, mining={"queries": 1000})
    PipelineConfig(refresh="sync", rounds=2, mining={"queries": 1000})
    PipelineConfig(refresh="async", rounds=1, mining={"queries": 1000})  # one refresh: nothing is swapped
    PipelineConfig(refresh="async", rounds=2, bm25_negatives={"queries": 1000})  # the warm-up's sample


def test_set_overrides_are_dotted_typed_by_the_config_and_named_when_wrong(tmp_path):
    import re

    from ance_core.pipeline.config import CompareConfig
    from ance_core.pipeline.recipes import recipe_config

    path = tmp_path / "x.yaml"
    path.write_text("rounds: 1\nance: {batch_size: 8}\n")
    cfg = load_config(path, sets=["ance.learning_rate=3e-5", "rounds=2", "mining.sampler=simans",
                                  "data.train_min_relevance=2", "compression.dims=[32, 16]", "index.nlist=null"])
    assert cfg.rounds == 2 and cfg.ance.learning_rate == 3e-5 and cfg.ance.batch_size == 8  # the file's kept
    assert cfg.mining.sampler == "simans" and cfg.data.train_min_relevance == 2 and cfg.compression.dims == [32, 16]
    assert recipe_config("full", ["ance.epochs=3"]).ance.epochs == 3 and recipe_config("full").rounds == 2
    assert load_config(None, CompareConfig, ["samplers=[ance, bm25]"]).samplers == ["ance", "bm25"]
    assert load_config(path, sets=["data.eval_split=2019"]).data.eval_split == "2019"  # a string field keeps text
    prefixed = load_config(path, sets=["model.query_prefix=query: ", 'model.passage_prefix="passage: "']).model
    assert (prefixed.query_prefix, prefixed.passage_prefix) == ("query: ", "passage: ")  # the trailing space kept
    assert load_config(path, sets=["model.query_prefix=[x"]).model.query_prefix == "[x"  # not YAML: text as typed
    for sets, named in ((["ance.learning_rat=3e-5"], "ance.learning_rat"), (["rounds=two"], "rounds"),
                        (["rounds.x=1"], "'rounds' is a value"), (["ance"], "expected key=value"),
                        (["ance..lr=1"], "expected key=value")):
        with pytest.raises(AnceError, match=re.escape(named)):
            load_config(path, sets=sets)
    with pytest.raises(AnceError) as err:  # PyYAML's own text spans several lines: one here
        load_config(path, sets=["rounds=[1,2"])
    assert str(err.value) == ("--set rounds=[1,2: the value is not valid YAML at character 5: expected ',' or ']', but "
                              "got '<stream end>' (a text value in quotes, inside the shell's: --set \"rounds='...'\")")


def test_compare_refuses_a_shared_mining_option_a_sampler_cannot_take_before_any_work():
    """mining is shared by every sampler compared: one that cannot take an option is refused when the config is read,
    naming the sampler, not after the samplers before it trained (model_copy skips the validators)."""
    from ance_core.pipeline.config import CompareConfig

    teacher = {"teacher": {"model": "minilm"}}
    with pytest.raises(ValueError, match="samplers: 'in-batch' cannot take the shared mining options: teacher: sampler "
                                         "'in-batch' mines no negatives"):
        CompareConfig(samplers=["bm25", "ance", "in-batch"], mining=teacher)
    assert CompareConfig(samplers=["bm25", "ance"], mining=teacher).sampler_mining("bm25").teacher.model == "minilm"
    assert CompareConfig(samplers=["bm25"]).sampler_mining("bm25").top_k is None  # BM25's depth is its own
    with pytest.raises(ValueError, match="samplers: 'nce' cannot take the shared mining options: teacher"):
        CompareConfig(samplers=["bm25", "ance", "nce"], mining=teacher)
    # a margin is taken by every BM25 sampler (the warm-up scores their candidates: tests/flows/test_compare.py)
    margin = CompareConfig(samplers=["ance", "bm25", "bm25+random"], mining={"margin": 0.1})
    assert [margin.sampler_mining(s).margin for s in ("ance", "bm25", "bm25+random")] == [0.1] * 3


def test_negatives_needed_counts_only_the_stages_that_will_mine():
    """The pre-flight's need: the most negatives any stage that runs draws per pair (issue 41)."""
    from ance_core.pipeline.config import CompareConfig, negatives_needed

    assert negatives_needed(PipelineConfig(bm25_negatives={"num_negatives": 3}, mining={"num_negatives": 2})) == 3
    # a retrain has no warm-up; a warm-up-only run no rounds; in-batch negatives come from no corpus draw
    assert negatives_needed(PipelineConfig(start_checkpoint="/c", bm25_negatives={"num_negatives": 3})) == 1
    assert negatives_needed(PipelineConfig(warmup_only=True, mining={"num_negatives": 5})) == 1
    assert negatives_needed(PipelineConfig(rounds=0, bm25_negatives={"sampler": "in-batch"})) == 0
    assert negatives_needed(CompareConfig(samplers=["in-batch"], mining={"num_negatives": 4})) == 1  # its warm-up


def test_recipe_drift_names_the_recipes_values_a_config_does_not_hold():
    """The recipe search warns when its base config is not the recipe it names (a run form opens with demo's
    values whatever tune.recipe says): each missing override with the config's own value."""
    from ance_core.pipeline.recipes import recipe_config, recipe_drift

    assert recipe_drift(recipe_config("demo"), "demo") == [] and recipe_drift(recipe_config("full"), "full") == []
    assert recipe_drift(recipe_config("full-maxp"), "full-maxp") == []  # its unset lengths read back as null
    assert "warmup.passage_max_length=null (the config: 128)" in recipe_drift(recipe_config("full"), "full-maxp")
    assert recipe_drift(recipe_config("demo"), "full") == ["rounds=2 (the config: 1)",
                                                           "warmup.epochs=2 (the config: 1)"]
    assert recipe_drift(recipe_config("demo", ["ance.learning_rate=2e-5"]), "demo") == [
        "ance.learning_rate=4e-05 (the config: 2e-05)"]
    # an option left out of a config's dump at its unsaid value (hidden_dropout: null) is read, not a KeyError
    assert recipe_drift(recipe_config("full"), "demo") == ["warmup.hidden_dropout=0.0 (the config: null)",
                                                           "ance.hidden_dropout=0.0 (the config: null)"]


def test_a_config_left_at_the_run_forms_recipe_takes_the_recipe_the_search_names(monkeypatch):
    """Found by a review of the Prefect UI's forms: ance-tune's (and ance-train-auto's) form opens with demo's config,
    and choosing tune.recipe full-maxp there only warned, then searched demo's settings under full-maxp's name. A
    config holding the form's values in every setting where the two recipes differ now takes the named recipe's; a
    config built from the recipe (the CLI) or with one of them changed by the user is kept as given."""
    from ance_core.pipeline.recipes import form_rebased, recipe_config, recipe_drift

    for name in ("full", "full-maxp"):
        rebased, taken = form_rebased(recipe_config("demo", ["data.dataset=mine"]), name, "demo")
        assert rebased == recipe_config(name, ["data.dataset=mine"]) and recipe_drift(rebased, name) == []
        assert "rounds=2" in taken and "warmup.hidden_dropout=null" in taken  # (demo's own settings undone too)
    assert form_rebased(recipe_config("demo"), "demo", "demo") == (recipe_config("demo"), [])
    as_built = recipe_config("full", ["warmup.epochs=1"])  # `ance tune --recipe full --set warmup.epochs=1`
    assert form_rebased(as_built, "full", "demo") == (as_built, [])
    changed = recipe_config("demo", ["rounds=3"])  # the user changed a setting the recipes differ in: theirs
    assert form_rebased(changed, "full", "demo") == (changed, [])

    import flows.tune as tune_flow
    from ance_core.pipeline.tune import TuneConfig

    class Seen(Exception):
        pass

    def seen(config, name):
        raise Seen(config)

    monkeypatch.setattr(tune_flow, "recipe_drift", seen)  # the search's base, once the flow has rebased it
    with pytest.raises(Seen) as base:  # called by the CLI (or another flow): its config as given
        tune_flow.tune_recipe.fn(recipe_config("demo"), TuneConfig(recipe="full-maxp"))
    assert base.value.args[0] == recipe_config("demo")
    import flows.tune_inputs as tune_inputs

    monkeypatch.setattr(tune_inputs, "started_from_a_deployment", lambda: True)  # the UI's form
    with pytest.raises(Seen) as base:
        tune_flow.tune_recipe.fn(recipe_config("demo"), TuneConfig(recipe="full-maxp"))
    assert base.value.args[0] == recipe_config("full-maxp")


@pytest.mark.parametrize("sets, field, said", [
    (["rounds=true"], "rounds", "true is not a number"),  # (pydantic took it as 1: a run of one round)
    (["warmup.learning_rate=false"], "warmup.learning_rate", "false is not a number"),
    (["data.train_min_relevance=true"], "data.train_min_relevance", "true is not a number"),
    (["warmup.learning_rate=.inf"], "warmup.learning_rate", "finite number"),  # (it failed at the first step)
    (["warmup.seed=-1"], "warmup.seed", "greater than or equal to 0"),  # (it failed at the first batch, traceback)
    (["mining.seed=-1"], "mining.seed", "greater than or equal to 0"),
])
def test_numbers_that_cannot_run_are_refused_naming_their_field(sets, field, said):
    with pytest.raises(AnceError) as e:
        load_config(None, PipelineConfig, sets)
    assert f": {field}: " in str(e.value) and said in str(e.value) and "\n" not in str(e.value), str(e.value)
    PipelineConfig.model_validate({"hybrid": True, "rounds": 2})  # (a bool field still takes a bool)


@pytest.mark.parametrize(("sets", "said"), [
    (["warmup.lerning_rate=1e-5"], "warmup.lerning_rate: not a setting of warmup; did you mean warmup.learning_rate?"),
    (["rouds=2"], "rouds: not a section or setting of the config; did you mean rounds?"),
    (["learning_rate=1e-5"], "learning_rate: not a section or setting of the config; it is set in a section: "
                             "warmup.learning_rate, ance.learning_rate"),
    (["data.nosuch=1"], "data.nosuch: not a setting of data (its settings: dataset, name, format, data_home, download, "
                        "train_split, eval_split, dev_split, dev_fraction, dev_seed, dev_fold, train_min_relevance)"),
    (["ance.nosuch=1"], "ance.nosuch: not a setting of ance"),  # (nothing close: no guess; too many to list)
])
def test_an_unknown_key_is_one_line_naming_the_setting_it_is_closest_to(sets, said):
    """A typo was pydantic's 'Extra inputs are not permitted' on a second line, with no hint of the right name."""
    with pytest.raises(AnceError) as e:
        load_config(None, PipelineConfig, sets)
    assert str(e.value) == f"invalid config (with --set {sets[0]}): {said}", str(e.value)


def test_an_unknown_search_setting_lists_the_searchs_settings():
    """A probe: `ance tune --tune-set bogus=1` said 'not a section or setting of the config', listing nothing."""
    from ance_core.pipeline.tune import TuneConfig

    with pytest.raises(AnceError, match=r"bogus: not a section or setting of the config \(its settings: recipe, "
                                        r"learning_rates, positives, warmup_epochs, seeds, eta, margin, "
                                        r"budget_minutes\)"):
        load_config(None, TuneConfig, ["bogus=1"], flag="--tune-set")


def test_several_errors_are_one_line_each_under_the_header():
    with pytest.raises(AnceError) as e:
        load_config(None, PipelineConfig, ["rouds=1", "warmup.batch_size=-1"])
    lines = str(e.value).splitlines()
    assert lines[0].endswith(":") and len(lines) == 3 and any(line.startswith("  rouds: ") for line in lines), lines


def test_a_whole_configs_error_is_its_message_without_the_config_again():
    from ance_core.pipeline.loading import format_validation_error

    with pytest.raises(ValidationError) as e:
        PipelineConfig.model_validate({"data": {"eval_split": "train"}, "model": {"name": "x" * 200}})
    lines = format_validation_error(e.value).splitlines()
    assert lines == ["  data.train_split and data.eval_split are both 'train': training on the evaluation split would "
                     "report leaked metrics"]


def test_a_key_given_twice_in_a_config_file_is_refused_where_it_is(tmp_path):
    """PyYAML kept the last of two keys silently (a probe: `rounds:` twice ran the second, whichever was meant)."""
    for name, text, said in (("top.yaml", "rounds: 1\nwarmup:\n  epochs: 1\nrounds: 2\n",
                              "top.yaml:4:1: not valid YAML/JSON: 'rounds' is given twice (first on line 1)"),
                             ("nested.yaml", "warmup:\n  epochs: 1\n  epochs: 2\n", "nested.yaml:3:3: "),
                             ("file.json", '{"rounds": 1, "rounds": 2}', "file.json:1:15: ")):
        (tmp_path / name).write_text(text)
        with pytest.raises(AnceError) as err:
            load_config(tmp_path / name)
        assert str(err.value).startswith(f"{tmp_path / name}") and said in str(err.value), str(err.value)
    (tmp_path / "fine.yaml").write_text("warmup:\n  epochs: 1\nance:\n  epochs: 1\n")  # (the same key in two sections)
    assert load_config(tmp_path / "fine.yaml").ance.epochs == 1


def test_a_set_of_a_section_a_yaml_alias_shares_changes_that_section_only(tmp_path):
    """A probe: yaml.safe_dump writes two equal sections as an anchor and an alias (`ance: *id001`), and a --set of
    one changed both, silently (copy.deepcopy keeps what YAML shares)."""
    (tmp_path / "aliased.yaml").write_text("warmup: &id001\n  batch_size: 4\n  max_steps: 3\nance: *id001\n")
    config = load_config(tmp_path / "aliased.yaml", sets=["warmup.max_steps=7"])
    assert (config.warmup.max_steps, config.ance.max_steps, config.ance.batch_size) == (7, 3, 4)
    (tmp_path / "loop.yaml").write_text("warmup: &w\n  batch_size: 4\n  self: *w\n")  # (a review: a RecursionError)
    with pytest.raises(AnceError, match=r"loop.yaml: the config holds a YAML alias inside the mapping or list it "):
        load_config(tmp_path / "loop.yaml")


def test_a_setting_given_twice_by_set_is_refused():
    """A probe: `--set rounds=1 --set rounds=2` ran the second silently (`--rounds 2 --set rounds=1` is refused)."""
    with pytest.raises(AnceError, match=r"--set rounds=1 and --set rounds= 2 both set rounds: give it once"):
        load_config(None, sets=["rounds=1", "rounds= 2"])
    assert load_config(None, sets=["warmup.epochs=2", "ance.epochs=3"]).ance.epochs == 3  # (other sections' keys)


def test_a_config_file_written_in_utf16_is_read(tmp_path):
    """A probe: a config saved by PowerShell's `>` (UTF-16 with its mark) was "'utf-8' codec can't decode byte 0xff";
    the data files take it already."""
    (tmp_path / "ps.yaml").write_bytes("rounds: 2\r\nwarmup:\r\n  batch_size: 4\r\n".encode("utf-16"))
    config = load_config(tmp_path / "ps.yaml")
    assert (config.rounds, config.warmup.batch_size) == (2, 4)


def test_a_dotted_key_in_a_config_file_says_how_a_file_nests_it(tmp_path):
    """A probe: `warmup.batch_size: 4` in a file was 'not a section or setting of the config', a real setting."""
    (tmp_path / "dotted.yaml").write_text("warmup.batch_size: 4\n")
    with pytest.raises(AnceError, match=r"warmup.batch_size: not a section or setting of the config: a dotted key is "
                                        r"--set's; a file nests it, `warmup: \{batch_size: ...\}`"):
        load_config(tmp_path / "dotted.yaml")


def test_a_pipeline_config_given_for_one_of_its_sections_gives_that_section(tmp_path):
    """`ance compress --config pipeline.yaml`: its compression section (a probe: every section was 'Extra inputs')."""
    from ance_core.compression.config import CompressConfig

    (tmp_path / "p.yaml").write_text("data:\n  dataset: toy\ncompression:\n  dims: [16]\n")
    with pytest.warns(AnceWarning, match=r"p.yaml: its compression section is read; its other sections \(data\)"):
        assert load_config(tmp_path / "p.yaml", CompressConfig, base_section="compression").dims == [16]
    (tmp_path / "c.yaml").write_text("dims: [32]\n")  # (its own fields, as before)
    assert load_config(tmp_path / "c.yaml", CompressConfig, base_section="compression").dims == [32]
