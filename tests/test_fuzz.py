"""Schemathesis against the live schema of a running stack (bench.fuzz, bounded and seeded): every
operation, all phases including stateful sequences, an operator's token; no server error and no
response that breaks the schema. ``python -m bench.fuzz`` runs the longer pass."""

from bench.fuzz import run_fuzz


def test_every_operation_survives_generated_input_without_a_5xx_or_a_schema_break(tmp_path):
    figures = run_fuzz(tmp_path, max_examples=3, seed=1)
    assert figures["failures"] == 0, (figures["failure_types"], figures["failing_operations"])
    assert figures["errors"] == 0, figures["output_tail"]
    assert figures["server_errors"] == 0 and figures["schema_violations"] == 0
    # it really ran: every operation of the schema, thousands of cases, the stateful phase too
    assert figures["operations"] >= 100
    assert figures["test_cases"] >= 3000
    assert figures["phases"]["stateful"] in ("success", "failure")
