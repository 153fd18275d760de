"""A job stopped by SIGTERM unwinds as a failure: its MLflow run is ended, not left RUNNING."""
from __future__ import annotations

import os
import signal

import mlflow
import pytest

from core.termination import TERMINATION_SIGNALS, exit_on_termination


@pytest.fixture
def restored_state():
    """pytest's own signal handlers and MLflow's store, as they were before the test."""
    saved = {number: signal.getsignal(number) for number in TERMINATION_SIGNALS}
    tracking_uri = mlflow.get_tracking_uri()
    yield
    for number, handler in saved.items():
        signal.signal(number, handler)
    mlflow.set_tracking_uri(tracking_uri)


def test_sigterm_ends_the_open_run_as_failed(tmp_path, restored_state):
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    mlflow.set_experiment("termination")
    exit_on_termination()
    with pytest.raises(SystemExit) as stopped:
        with mlflow.start_run() as run:
            run_id = run.info.run_id
            os.kill(os.getpid(), signal.SIGTERM)
            pytest.fail("SIGTERM did not stop the job")
    assert stopped.value.code == 128 + signal.SIGTERM
    assert mlflow.get_run(run_id).info.status == "FAILED"
    assert mlflow.active_run() is None
