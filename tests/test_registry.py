"""The collator registry is the one source of truth: every entry is drawn distinctly, and a new entry (one
`CollatorSpec` plus its collate class) reaches the CLI, the JSON document, the batch picture and the plots."""

import json

import matplotlib.colors
import pytest

import demo_core
from commandline.main import main
from demo_core.collators import COLLATORS, CollatorSpec, FlattenCollator
from presentation import batch_picture, plots


def test_every_collator_has_its_own_colour_and_line_style():
    specs = list(COLLATORS.values())
    colours = {matplotlib.colors.to_hex(spec.color) for spec in specs}
    assert len(colours) == len(specs)
    assert len({str(spec.linestyle) for spec in specs}) == len(specs)


def test_every_collator_says_why_and_what_it_claims():
    for spec in COLLATORS.values():
        assert spec.label.startswith(spec.name) and len(spec.why) > 20
        assert spec.layout in ("padded", "packed", "naive")
        # Only a collator that trains on padded's batches can claim padded's losses.
        assert not spec.loss_parity or spec.same_batches_as_padded, spec.name


class ReversedFlattenCollator(FlattenCollator):
    """The batch flattened in reverse example order: the same tokens and loss, another row."""

    def collate(self, features):
        return super().collate(features[::-1])


FAKE = CollatorSpec("reversed-flatten", "reversed-flatten: flatten, examples in reverse order",
                    "the same examples in one row, last first: no padding, the same loss", "packed",
                    ReversedFlattenCollator, loss_parity=True, color="#17becf", linestyle=(0, (2, 4)))


@pytest.fixture
def fake_collator(monkeypatch):
    monkeypatch.setitem(COLLATORS, FAKE.name, FAKE)
    return FAKE


def test_a_new_registry_entry_reaches_cli_json_picture_and_plots(fake_collator, tmp_path, capsys):
    out = tmp_path / "run.json"
    assert main(["compare", "--samples", "24", "--steps", "3", "--batch-size", "4", "--max-length", "256",
                 "--collators", f"padded,{FAKE.name}", "--json", str(out)]) == 0
    assert FAKE.name in capsys.readouterr().out
    document = json.loads(out.read_text())
    padded, fake = document["results"]
    assert fake["collator"] == FAKE.name and fake["pad_fraction"] == 0.0
    assert fake["step_real_tokens"] == padded["step_real_tokens"]
    assert document["comparison"][FAKE.name]["max_abs_loss_diff_vs_padded"] < 1e-4

    preview = demo_core.preview(demo_core.RunConfig(samples=24, batch_size=4, max_length=256,
                                                    collators=("padded", FAKE.name)))
    lengths = preview["batches"]["padded"]["lengths"]
    assert preview["batches"][FAKE.name]["lengths"] == lengths[::-1]
    picture_texts = [text.get_text() for text in batch_picture.batch_figure(preview).findobj(
        lambda artist: hasattr(artist, "get_text"))]
    assert any(f"used by {FAKE.name} in this run" in text for text in picture_texts)

    bar = plots.throughput_figure(document).axes[0].patches[1]
    assert matplotlib.colors.to_hex(bar.get_facecolor()) == FAKE.color
    line = plots.loss_figure(document).axes[0].get_lines()[1]
    assert matplotlib.colors.to_hex(line.get_color()) == FAKE.color
    assert line.get_linestyle() != plots.loss_figure(document).axes[0].get_lines()[0].get_linestyle()


def test_an_unregistered_name_is_refused_with_the_registry_choices(capsys):
    assert main(["compare", "--collators", "padded,reversed-flatten"]) == 2
    error = capsys.readouterr().err
    assert "unknown collator 'reversed-flatten'" in error and ", ".join(COLLATORS) in error
