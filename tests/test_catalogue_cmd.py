"""`kv-cache catalogue`: every registry's entries, read from the registries (an entry added to one is listed
with no other change), as text or JSON, a section at a time, the GPU table with a config's overlay."""

import json

import pytest

from kv_cache.cli import COMMANDS, main
from kv_cache.cli.catalogue_cmd import ALIASES, SCHEMA, SECTIONS, catalogue, format_text
from kv_cache.core import shapes
from kv_cache.metrics import catalogue as metrics
from kv_cache.specs.models import GPU_SPECS
from kv_cache.storage import backends
from kv_cache.workload.traces import formats


def _json(capsys, *argv):
    assert main(["catalogue", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_the_json_holds_every_registry(capsys):
    doc = _json(capsys)
    assert doc["schema_version"] == SCHEMA and list(doc)[2:] == list(SECTIONS)
    assert [b["name"] for b in doc["storage_backends"]] == backends.names()
    assert {b["name"]: b["tier"] for b in doc["storage_backends"]}["tracelog"] == "any"
    file = next(b for b in doc["storage_backends"] if b["name"] == "file")
    assert file["tier"] == "storage" and file["capabilities"]["o_direct"] and "cache_dir" in {
        o["name"] for o in file["options"]}
    assert [f["name"] for f in doc["trace_formats"]] == list(formats.names())
    assert {f["name"]: f["block_tokens"] for f in doc["trace_formats"]}["mooncake"] == 512
    assert [g["key"] for g in doc["gpus"]] == list(GPU_SPECS)
    h100 = next(g for g in doc["gpus"] if g["key"] == "h100")
    assert (h100["hbm_gb"], h100["hbm_bandwidth_gbs"], h100["host_link_gbs"]) == (80.0, 3350.0, 64.0)
    assert [m["key"] for m in doc["metrics"]] == [m.key for m in metrics.all_metrics()]
    assert all(m["summary"] and m["merge"] in metrics.MERGE_RULES for m in doc["metrics"])
    assert [s["name"] for s in doc["load_shapes"]] == [s.name for s in shapes.all_shapes()]
    assert {s["name"] for s in doc["load_shapes"] if s["autoscaling"]} == set(shapes.autoscaler_modes())


def test_the_text_is_one_line_per_entry(capsys):
    assert main(["catalogue"]) == 0
    out = capsys.readouterr().out
    for section in SECTIONS.values():
        assert f"{section.title}: " in out
    lines = out.splitlines()
    rows = {line.split()[0]: line for line in lines if line.startswith("  ")}  # entry lines, by first column
    assert rows["file"].split()[1] == "storage" and rows["tracelog"].split()[1] == "any"
    assert "3350 GB/s" in rows["h100"] and "64 GB/s each way" in rows["h100"]
    assert rows["storage_read_mean_op_mib"].split()[1] == "MiB"
    assert rows["qos"].endswith("--autoscaler-mode") and not rows["constant"].endswith("--autoscaler-mode")
    assert "directories" in rows["weka"] and "hash ids of 512 tokens" in rows["mooncake"]
    entries = sum(len(v) for k, v in catalogue([]).items() if k in SECTIONS)
    assert len(lines) == entries + 2 * len(SECTIONS) - 1  # a title each, a blank line between sections


def test_sections_one_at_a_time(capsys):
    assert list(_json(capsys, "gpus", "shapes"))[2:] == ["gpus", "load_shapes"]  # in the catalogue's order
    assert main(["catalogue", "metrics"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Output metrics") and "Storage backends" not in out
    assert set(ALIASES.values()) == set(SECTIONS)


def test_an_unknown_section_is_one_line_and_exit_2(capsys):
    assert main(["catalogue", "nope"]) == 2
    err = capsys.readouterr().err
    assert err == "kv-cache catalogue: error: unknown section 'nope' (choose from backends, traces, gpus, metrics, " \
                  "shapes)\n"


def test_a_configs_gpus_overlay_the_table(tmp_path, capsys):
    cfg = tmp_path / "g.yaml"
    cfg.write_text("gpus:\n  h100:\n    hbm_gb: 94\n  toy:\n    name: Toy GPU\n    hbm_gb: 8\n"
                   "    hbm_bandwidth_gbs: 100\n    peak_dense_tflops: 10\n")
    gpus = {g["key"]: g for g in _json(capsys, "gpus", "--config", str(cfg))["gpus"]}
    assert gpus["h100"]["hbm_gb"] == 94.0 and gpus["toy"]["name"] == "Toy GPU"
    assert "toy  " in "\n".join(format_text({"gpus": list(gpus.values())}))
    assert main(["catalogue", "gpus", "--config", str(tmp_path / "none.yaml")]) == 2  # a config error, one line


def test_an_entry_added_to_a_registry_is_listed(monkeypatch, capsys):
    formats.all_formats(), metrics.all_metrics(), shapes.all_shapes(), backends.all_backends()  # loaded first
    monkeypatch.setitem(formats._ENTRIES, "toy-fmt", formats.TraceFormat(name="toy-fmt", summary="a toy trace",
                                                                         read=lambda *a: iter(())))
    monkeypatch.setitem(metrics._ENTRIES, "toy_metric_ratio",
                        metrics.Metric("toy_metric_ratio", "Toy", "", lambda m: None, "a toy figure"))
    monkeypatch.setitem(shapes._ENTRIES, "toy-shape", shapes.Shape("toy-shape", "a toy shape", build=lambda r: None))
    monkeypatch.setitem(backends._ENTRIES, "toy-store", backends.Backend(
        name="toy-store", tier=None, summary="a toy store", capabilities=backends.Capabilities(), open=lambda r: None))
    assert main(["catalogue"]) == 0
    out = capsys.readouterr().out
    for name, summary in (("toy-fmt", "a toy trace"), ("toy_metric_ratio", "a toy figure"),
                          ("toy-shape", "a toy shape"), ("toy-store", "a toy store")):
        assert any(line.split()[0] == name and summary in line for line in out.splitlines() if line.strip()), name


def test_the_commands_help_names_it(capsys):
    assert "catalogue" in COMMANDS
    assert main(["--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "catalogue (what the registries hold" in text
    assert main(["catalogue", "--help"]) == 0
    assert "--json" in capsys.readouterr().out


@pytest.mark.parametrize("argv", [["catalogue", "--bogus"], ["catalogue", "--jsn"]])
def test_a_bad_flag_is_refused(capsys, argv):
    assert main(argv) == 2
    assert capsys.readouterr().err.startswith("kv-cache catalogue: error: unrecognized arguments")


def test_a_section_is_also_named_by_its_json_key(capsys):
    """The --json document's keys (storage_backends, trace_formats, load_shapes) select their section too."""
    assert list(_json(capsys, "storage_backends", "load_shapes", "traces"))[2:] == [
        "storage_backends", "trace_formats", "load_shapes"]
