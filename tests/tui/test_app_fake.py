"""Dashboard behaviour against an in-process fake worker: fast and deterministic. When the
worker fails: test_app_faults.py."""

from __future__ import annotations

import json

import strategies
from strategies.config import TuneConfig
from textual.widgets import Checkbox, Input, Select

from screen_text import screen_text
from tui_fakes import GPU_CAPS, applied, async_test, make_app, number, wait_for
from tuner_tui.app.screens.export import ExportScreen
from tuner_tui.app.screens.help import HelpScreen
from tuner_tui.engine import protocol

SIZE = (160, 50)


@async_test
async def test_baseline_runs_at_start_and_lands_on_leaderboard():
    app, workers = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: len(app.session.rows) == 1)
        row = app.session.rows[0]
        assert row.result.label == "fp32"
        assert app.session.baseline is row
        assert applied(workers[0])[0]["precision"] == "fp32"
        assert app.leaderboard.row_count == 1
        await pilot.press("q")
        await wait_for(pilot, lambda: not workers[0].alive)
    assert app.return_code == 0


@async_test
async def test_start_config_runs_after_the_baseline_and_is_compared_with_it():
    start = TuneConfig().replace(precision="bf16", attention="sdpa")
    app, workers = make_app(start)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: len(app.session.rows) == 2)
        base, tuned = app.session.rows
        assert [c["precision"] for c in applied(workers[0])] == ["fp32", "bf16"]
        assert app.session.change_vs_baseline(tuned) > 2.0
        assert app.session.change_vs_baseline(base) == 1.0


@async_test
async def test_the_options_follow_a_run_the_user_did_not_edit_and_keep_edits_they_did():
    start = TuneConfig().replace(precision="bf16", attention="sdpa")
    app, workers = make_app(start)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: len(app.session.rows) == 2)
        # The start configuration was applied by the app, not typed: the panel shows it.
        assert app.query_one("#opt-precision", Select).value == "bf16"
        assert app.query_one("#opt-attention", Select).value == "sdpa"
        # An edit not applied yet survives a run started by something else.
        app.query_one("#opt-optimizer", Select).value = "foreach"
        await pilot.pause()
        app.apply_in_turn([TuneConfig()])
        await wait_for(pilot, lambda: len(app.session.rows) == 3)
        assert app.query_one("#opt-optimizer", Select).value == "foreach"
        assert app.query_one("#opt-precision", Select).value == "bf16"
        assert app.toggles.applied == TuneConfig()
        await pilot.press("q")
        await wait_for(pilot, lambda: not workers[0].alive)


@async_test
async def test_toggling_an_option_and_applying_reaches_the_worker():
    app, workers = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: len(app.session.rows) == 1)
        app.query_one("#opt-precision", Select).value = "bf16"
        app.query_one("#opt-optimizer", Select).value = "fused"
        await pilot.pause()
        assert app.query_one("#row-precision").has_class("-changed")
        await pilot.click("#apply")
        await wait_for(pilot, lambda: len(app.session.rows) == 2)
        sent = applied(workers[0])[-1]
        assert sent["precision"] == "bf16" and sent["optimizer"] == "fused"
        assert app.session.rows[-1].result.label == "bf16 + fused AdamW"
        # Once the worker started the run, the toggles no longer show pending changes.
        assert not app.query_one("#row-precision").has_class("-changed")


@async_test
async def test_a_key_applies_and_inputs_are_validated():
    app, workers = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: len(app.session.rows) == 1)
        app.query_one("#opt-batch_size", Input).value = "16"
        await pilot.press("a")
        await wait_for(pilot, lambda: len(app.session.rows) == 2)
        assert applied(workers[0])[-1]["batch_size"] == 16
        # Full graph without compile is refused before anything is sent, naming both options.
        app.query_one("#opt-compile_fullgraph").value = True
        await pilot.press("a")
        await pilot.pause(0.2)
        assert len(applied(workers[0])) == 2
        assert any("compile_fullgraph" in n.message and "compile_mode" in n.message for n in app._notifications)


@async_test
async def test_options_the_machine_cannot_run_are_disabled_with_the_reason():
    app, workers = make_app()  # CPU capabilities: no CUDA, no Triton
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.session.capabilities is not None and len(app.session.rows) == 1)
        await pilot.pause()
        boxes = list(app.query_one("#opt-fused_kernels").query(Checkbox))
        assert boxes and all(b.disabled for b in boxes)
        assert "Triton" in str(boxes[0].tooltip)
        # fp16 needs CUDA: marked in the select, explained in the help line, refused on apply.
        select = app.query_one("#opt-precision", Select)
        assert any("✗" in str(prompt) and value == "fp16" for prompt, value in select._options)
        select.value = "fp16"
        select.focus()
        await pilot.pause()
        assert "needs a CUDA GPU" in screen_text(app)
        assert app.query_one("#row-precision").has_class("-unavailable")
        await pilot.press("a")
        await pilot.pause(0.2)
        assert len(applied(workers[0])) == 1
        assert any("precision = fp16" in n.message for n in app._notifications)


@async_test
async def test_on_a_gpu_everything_is_enabled():
    app, workers = make_app(caps=GPU_CAPS)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.session.capabilities is not None)
        await pilot.pause()
        assert not any(b.disabled for b in app.query_one("#opt-fused_kernels").query(Checkbox))
        app.query_one("#opt-fused_kernels--layer_norm", Checkbox).value = True
        app.query_one("#opt-compile_mode", Select).value = "default"
        await pilot.press("a")
        await wait_for(pilot, lambda: len(app.session.rows) == 2)
        sent = applied(workers[0])[-1]
        assert sent["fused_kernels"] == ["layer_norm"] and sent["compile_mode"] == "default"
        assert app.session.rows[-1].result.compile_s == 12.5


@async_test
async def test_compiling_indicator_counts_seconds():
    app, workers = make_app()
    now = [100.0]
    app.clock = lambda: now[0]
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: len(app.session.rows) == 1)
        # Feed a compile start by hand, as the worker would while torch.compile works.
        run_id = app.session.run_id
        workers[0]._emit(protocol.CompileStarted(run_id))
        await wait_for(pilot, lambda: app.session.worker_state == "compiling")
        now[0] += 7.2
        app.refresh_live()
        await pilot.pause()
        assert "building torch.compile… 7s" in screen_text(app)
        workers[0]._emit(protocol.CompileFinished(run_id, 7.3))
        await wait_for(pilot, lambda: app.session.worker_state == "running")


@async_test
async def test_pause_and_resume():
    app, workers = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: len(app.session.rows) == 1)
        await pilot.press("p")
        await wait_for(pilot, lambda: app.session.worker_state == "paused")
        await pilot.press("p")
        await wait_for(pilot, lambda: app.session.worker_state == "running")
        kinds = [type(c).__name__ for c in workers[0].commands]
        assert kinds[-2:] == ["Pause", "Resume"]


@async_test
async def test_leaderboard_sorts_selects_and_reapplies():
    start = TuneConfig().replace(precision="bf16")
    app, workers = make_app(start)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: len(app.session.rows) == 2)
        await pilot.press("s")  # by tokens/s, best first
        assert app.leaderboard.sort_column == "tokens"
        first = app.leaderboard.get_row_at(0)
        assert number(first[0]) == 2  # bf16 is faster
        app.leaderboard.focus()
        await pilot.pause()
        await pilot.press("up")
        await pilot.pause()
        assert app._selected_row().number == 2 and "2: bf16" in screen_text(app)
        await pilot.press("down")
        await pilot.pause()
        assert app._selected_row().number == 1
        assert "1: fp32" in screen_text(app)
        await pilot.press("r")
        await wait_for(pilot, lambda: len(app.session.rows) == 3)
        assert applied(workers[0])[-1]["precision"] == "fp32"
        assert app.query_one("#opt-precision", Select).value == "fp32"


@async_test
async def test_a_row_that_failed_the_gradient_gate_is_not_the_default_export():
    app, workers = make_app(TuneConfig().replace(precision="bf16"), fail={"bf16": "numerics"})
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: len(app.session.rows) == 2)
        assert app.session.current_result().status == "numerics"
        what, exported = app.export_target()
        # The fastest row that passed, not the faster current one.
        assert exported.config.precision == "fp32" and what.startswith("run 1:")
        # (the leaderboard is redrawn on the next refresh, not when the row arrives)
        await wait_for(pilot, lambda: "numerics" in screen_text(app))


@async_test
async def test_export_writes_a_file_that_strategies_loads(tmp_path):
    start = TuneConfig().replace(precision="bf16", optimizer="foreach")
    app, workers = make_app(start)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: len(app.session.rows) == 2)
        await pilot.press("e")
        await wait_for(pilot, lambda: isinstance(app.screen, ExportScreen))
        path_input = app.screen.query_one("#export-path", Input)
        path_input.value = str(tmp_path / "gputune.toml")
        await pilot.press("enter")
        await wait_for(pilot, lambda: (tmp_path / "gputune.toml").exists())
        assert strategies.load(tmp_path / "gputune.toml") == start
        exported = strategies.read(tmp_path / "gputune.toml")
        assert exported.measured["tokens_per_s"] > 0 and exported.workload == "gpt2-tiny"
        assert any(str(tmp_path / "gputune.toml") in n.message for n in app._notifications)

        # The chosen row, as JSON.
        app.leaderboard.focus()
        await pilot.pause()
        await pilot.press("up")
        await pilot.pause()
        await pilot.press("e")
        await wait_for(pilot, lambda: isinstance(app.screen, ExportScreen))
        await pilot.click("#fmt-json")
        path_input = app.screen.query_one("#export-path", Input)
        assert path_input.value.endswith(".json")
        path_input.value = str(tmp_path / "base.json")
        await pilot.click("#export")
        await wait_for(pilot, lambda: (tmp_path / "base.json").exists())
        assert json.loads((tmp_path / "base.json").read_text())["config"]["precision"] == "fp32"
        assert strategies.load(tmp_path / "base.json") == TuneConfig()


@async_test
async def test_export_for_a_trainer_says_it_keeps_the_file_it_replaces(tmp_path):
    app, workers = make_app(TuneConfig().replace(precision="bf16"))
    old = tmp_path / "run-hf.yaml"
    old.write_text("# an earlier export\n")
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: len(app.session.rows) == 2)
        await pilot.press("e")
        await wait_for(pilot, lambda: isinstance(app.screen, ExportScreen))
        path_input = app.screen.query_one("#export-path", Input)
        path_input.value = str(tmp_path / "run.toml")
        await pilot.click("#fmt-hf")
        await pilot.pause()
        assert path_input.value == str(old)
        note = str(app.screen.query_one("#export-note").render())
        assert "Hugging Face TrainingArguments" in note
        assert "run-hf.yaml exists: it will be kept as run-hf.yaml.1" in note
        await pilot.click("#export")
        await wait_for(pilot, lambda: (tmp_path / "run-hf.yaml.1").exists())
        assert (tmp_path / "run-hf.yaml.1").read_text() == "# an earlier export\n"
        assert "bf16: true" in old.read_text().splitlines()


@async_test
async def test_export_to_an_unwritable_path_says_why(tmp_path):
    app, workers = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: len(app.session.rows) == 1)
        await pilot.press("e")
        await wait_for(pilot, lambda: isinstance(app.screen, ExportScreen))
        app.screen.query_one("#export-path", Input).value = str(tmp_path / "missing" / "x.toml")
        await pilot.press("enter")
        await wait_for(pilot, lambda: any("cannot write" in n.message for n in app._notifications))
        assert not isinstance(app.screen, ExportScreen)


@async_test
async def test_help_and_command_palette_reach_every_action():
    app, workers = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("question_mark")
        await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen))
        await pilot.press("escape")
        await wait_for(pilot, lambda: not isinstance(app.screen, HelpScreen))
        titles = {c.title for c in app.get_system_commands(app.screen)}
        actions = {b.action for b in app.BINDINGS}
        wanted = {
            "apply": "Apply options", "toggle_pause": "Pause / resume training",
            "reapply": "Re-apply selected row", "export": "Export configuration",
            "sort": "Sort leaderboard", "baseline": "Apply baseline",
            "restart_worker": "Restart worker", "help": "Help", "quit": "Quit gputune",
            "history": "History", "search": "Search", "profile": "Profile",
            "profile(True)": "Profile and write a trace", "log": "Log", "next_view": "Next view",
        }
        assert actions == set(wanted)
        assert set(wanted.values()) <= titles


@async_test
async def test_a_flood_of_steps_collapses_into_few_ui_wakeups():
    app, workers = make_app(steps=3000)
    woken = []
    async with app.run_test(size=SIZE) as pilot:
        original = app.reader.take
        app.reader.take = lambda: woken.append(1) or original()
        await wait_for(pilot, lambda: len(app.session.rows) == 1, timeout=20)
        assert len(app.session.throughput) == 3000
        assert len(woken) < 300


@async_test
async def test_apply_in_turn_runs_each_configuration_after_the_previous_one():
    app, workers = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: len(app.session.rows) == 1)
        app.apply_in_turn([TuneConfig().replace(precision="bf16"), TuneConfig().replace(optimizer="fused")])
        await wait_for(pilot, lambda: len(app.session.rows) == 3)
        assert [r.result.label for r in app.session.rows] == ["fp32", "bf16", "fp32 + fused AdamW"]


@async_test
async def test_command_palette_runs_an_action():
    app, workers = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: len(app.session.rows) == 1)
        await pilot.press("ctrl+p")
        await pilot.pause(0.2)
        await pilot.press(*"export configuration")
        await pilot.pause(0.5)
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, ExportScreen), timeout=5)
        await pilot.press("escape")
        await wait_for(pilot, lambda: not isinstance(app.screen, ExportScreen))


@async_test
async def test_history_lists_stored_trials_and_reapplies_one(tmp_path, monkeypatch):
    from tuner_tui.app.screens.history import HistoryScreen
    from tuner_tui.engine.store import ResultStore, workload_key

    monkeypatch.setenv("GPUTUNE_HOME", str(tmp_path))
    app, workers = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: len(app.session.rows) == 1)
        tuned = TuneConfig().replace(precision="bf16", optimizer="fused")
        # The key `tune` and `bench` store under, from the worker's description of the workload.
        key = workload_key(app.session.workload)
        with ResultStore() as store:
            for config, tokens in ((TuneConfig(), 1000.0), (tuned, 2500.0)):
                result = protocol.TrialResult(config=config.to_dict(), label=config.label(), status="ok", tokens_per_s=tokens)
                store.record(result, app.session.environment, key, 20, 5)
            # Another machine's trial is not this machine's history, nor another seed's.
            store.record(result, {"device": "cuda", "gpu_name": "other"}, key, 20, 5)
            store.record(result, app.session.environment, key.replace("seed=0", "seed=1"), 20, 5)
        await pilot.press("h")
        await wait_for(pilot, lambda: isinstance(app.screen, HistoryScreen))
        assert len(app.screen.trials) == 2
        assert "bf16 + fused AdamW" in screen_text(app)
        await pilot.press("enter")  # the newest first: the tuned one
        await wait_for(pilot, lambda: len(app.session.rows) == 2)
        assert applied(workers[0])[-1]["optimizer"] == "fused"


@async_test
async def test_search_walks_the_options_and_applies_the_best():
    app, workers = make_app(caps=GPU_CAPS, steps=3)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: len(app.session.rows) == 1)
        await pilot.press("t")
        await wait_for(pilot, lambda: app.search is None, timeout=60)
        await wait_for(pilot, lambda: app.session.worker_state == "running" and app.session.current_result())
        labels = [r.result.label for r in app.session.rows]
        searched = labels[:-1]  # the last row is the winner, applied again at the end
        assert len(searched) >= 3 and len(searched) == len(set(searched))
        fastest = max(r.result.tokens_per_s for r in app.session.rows)
        sent = applied(workers[0])[-1]
        # The winner (the simpler of those tied with the fastest) is applied again at the end.
        winner = next(r for r in app.session.rows if r.result.config == sent)
        assert winner.result.tokens_per_s == fastest and labels[-1] == winner.result.label
        assert TuneConfig.from_dict(sent).precision in ("bf16", "fp16")
        assert sent["compile_mode"] != "off"
        assert app.leaderboard.sort_column == "tokens"
        assert any("search over" in (n.title or "") for n in app._notifications)


@async_test
async def test_applying_by_hand_stops_the_search():
    app, workers = make_app(caps=GPU_CAPS, steps=3)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: len(app.session.rows) == 1)
        await pilot.press("t")
        await wait_for(pilot, lambda: len(app.session.rows) >= 2)
        await pilot.press("b")
        assert app.search is None
        rows = len(app.session.rows)
        await pilot.pause(0.5)
        assert len(app.session.rows) <= rows + 1


@async_test
async def test_clicking_a_header_sorts_by_that_column():
    app, workers = make_app(TuneConfig().replace(precision="bf16"))
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: len(app.session.rows) == 2)
        table = app.leaderboard
        x = 1 + sum(c.get_render_width(table) for c in table.ordered_columns[:4]) + 2  # "step ms"
        await pilot.click("#leaderboard", offset=(x, 1))
        await pilot.pause()
        assert table.sort_column == "step"
        assert number(table.get_row_at(0)[0]) == 2  # bf16 has the shorter step


@async_test
async def test_the_footer_at_80_by_24_shows_help_and_quit():
    app, _ = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        def footer() -> str:
            return screen_text(app).rstrip("\n").splitlines()[-1]

        # (drawn on the first refresh, which a busy machine can take more than 0.5 s to reach)
        await wait_for(pilot, lambda: "? Help" in footer())
        assert "q Quit" in footer(), footer()
