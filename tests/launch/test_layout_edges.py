"""Edges of launch.layout that the mutation benchmark found untested: the
bounds of each check (one on each side) and the messages that name what is
wrong. No torch here."""

import pytest

from launch.layout import Layout, LayoutError, in_step_order, plan_ranks, split_layers, virtual_worker_blocks


@pytest.mark.parametrize("bad", [0, -1, 2.5, 1.0, None])
def test_a_degree_must_be_a_whole_number_of_at_least_one(bad):
    with pytest.raises(LayoutError, match=f"degree dp must be an integer >= 1, got {bad!r}"):
        Layout(1, bad, 1)
    assert Layout(1, 1, 1).world_size == 1


def test_an_unknown_dimension_is_named():
    with pytest.raises(LayoutError, match=r"unknown dimension 'ep' \(one of pp, dp, tp\)"):
        Layout(2, 2, 2).group("ep", 0)


def test_as_many_layers_as_stages_is_one_layer_each():
    assert split_layers(3, 3) == (range(0, 1), range(1, 2), range(2, 3))
    assert split_layers(1, 1) == (range(0, 1),)
    with pytest.raises(LayoutError, match="cannot split 2 layers into 3 pipeline stages"):
        split_layers(2, 3)


def test_one_dp_rank_runs_every_virtual_worker():
    assert virtual_worker_blocks(4, 1) == (range(0, 4),)
    assert virtual_worker_blocks(1, 1) == (range(0, 1),)
    with pytest.raises(LayoutError) as e:
        virtual_worker_blocks(4, 0)
    assert str(e.value) == (
        "4 virtual workers cannot be spread over dp=0 ranks: every dp rank needs at least one (dp <= virtual workers)"
    )
    with pytest.raises(LayoutError, match="every dp rank needs at least one"):
        virtual_worker_blocks(2, 3)


def test_task_counts_must_match_the_step_nodes():
    with pytest.raises(LayoutError, match="1 task counts for the 2 nodes of the step"):
        plan_ranks(("n1", "n2"), ("n2", "n1"), (2,))


def test_in_step_order_names_the_field_and_the_sizes():
    with pytest.raises(LayoutError, match="plan field 'stage_layers' has 3 entries for pp=2"):
        in_step_order((1, 2, 3), Layout(2, 1, 1), (0, 1), "pp", "stage_layers")
    with pytest.raises(LayoutError, match=r"the step's ranks \[0, 0\] are not a permutation of the plan's 2"):
        in_step_order((1, 2), Layout(2, 1, 1), (0, 0), "pp", "stage_layers")
