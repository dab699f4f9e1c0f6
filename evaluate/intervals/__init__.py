"""Intervals and marks: what a table's numbers are sure of, over the test questions and the trained seeds.

    bootstrap.py      the two-level (questions x seeds) bootstrap: row intervals, paired differences, power
    significance.py   the marks (†, ‡): which differences an interval shows, under the family-wise rule
    simulate.py       the simulations that check the intervals' coverage and the marks' error rate

Read bootstrap.py first; the tables (evaluate/tables.py, scenario_tables.py) and the selective-answer and
study readings call these three modules by name.
"""
