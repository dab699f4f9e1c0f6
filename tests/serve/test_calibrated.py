"""Calibrated runs served (issue 45, item 6): a walla-i-cal pool reports each agent's probabilities through
its own fitted temperature head(s), as walla train pooled them, so the served pool equals walla train's on
the run's test questions; a run trained with train.calibrated (temperatures not saved) is refused in one line.
"""

from __future__ import annotations

import numpy as np
import pytest
import trained_market
from serve_fixtures import start_serving, train_tiny_pool
from walla.market.head import AgentHead, HeadError
from walla.market.payouts import pooled_forecast
from walla.serve.check import check_served
from walla.serve.config import ServeConfig
from walla.serve.loading import load_pool

CAL = "walla-i-cal.calibration={epochs: 5, lr: 0.01, hidden: [8], min_rows: 5}"


@pytest.fixture(scope="module")
def cal_market(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cal")
    market = train_tiny_pool(tmp)  # bfloat16: tier bitwise, so served features equal the stored ones
    runs = tmp / "runs-cal"
    trained_market.train_more(market, runs, "walla-i-cal", CAL)
    return {**market, "runs": runs}


def test_a_calibrated_pool_is_served_as_walla_train_pooled_it(cal_market, tmp_path):
    pool = load_pool(
        ServeConfig(
            scenario=cal_market["scenario"],
            runs=cal_market["runs"],
            store=cal_market["store"],
            method="walla-i-cal",
        )
    )
    try:
        assert pool.choice.method == "walla-i-cal" and all(a.head.calibrate is not None for a in pool.agents)
        srv, s = start_serving(pool, tmp_path)
        try:
            res = check_served(s.fc)
        finally:
            srv.__exit__()
            s.fc.stop()
            s.ledger.close()
        assert res["problems"] == [], res
        assert res["pool"] <= 1e-6 and res["path_pool"] <= 1e-6 and res["wagers"] <= 1e-6, res
        # the temperatures matter here: pooling the raw probabilities would be far from walla train's pool
        record, table = pool.choice.seeds[pool.seed], pool.choice.table
        gaps = []
        for r, q in enumerate(table.question_id):
            row, k = pool.row_of[str(q)], int(pool.data.n_options[pool.row_of[str(q)]])
            probs = [pool.data.probs[row, a.slot, :k].tolist() for a in pool.agents]
            wagers = [a.head.wager(np.asarray(pool.data.hidden[a.slot][row])) for a in pool.agents]
            raw = pooled_forecast(probs, wagers, pool.settings.pooling, k)["probabilities"]
            gaps.append(float(np.abs(np.array(raw) - record.agg_probs[r, :k]).max()))
        assert max(gaps) > 1e-4, max(gaps)
    finally:
        pool.close()


def test_a_run_calibrated_before_every_method_is_refused_in_one_line(cal_market, tmp_path):
    runs = tmp_path / "runs"
    trained_market.train_more({**cal_market, "runs": runs}, runs, "walla-i", "--calibrated")
    run = next(runs.rglob("state.pt")).parent
    with pytest.raises(HeadError) as e:
        AgentHead.from_run(run, 0)
    assert "train.calibrated" in str(e.value) and "\n" not in str(e.value), e.value
