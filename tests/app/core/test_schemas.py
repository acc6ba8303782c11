"""app/core/schemas.py: the shapes that are written twice stay the same."""

from __future__ import annotations

import typing

from app.core.schemas import BatchEpisodeOut, EpisodeSummary


def test_episode_summary_is_the_batch_episode_row_plus_meta_json():
    # batch_summaries selects EpisodeSummary._fields as columns and the batch API answers each
    # row as a BatchEpisodeOut: the names, their order and their types must agree.
    api = BatchEpisodeOut.model_fields
    assert EpisodeSummary._fields == (*api, "meta_json")
    hints = typing.get_type_hints(EpisodeSummary)
    assert {n: hints[n] for n in api} == {n: f.annotation for n, f in api.items()}
    assert hints["meta_json"] is str
