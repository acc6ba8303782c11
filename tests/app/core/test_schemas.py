"""app/core/schemas.py: the shapes that are written twice stay the same."""

from __future__ import annotations

import typing

from pydantic_core import PydanticUndefined

from app.core.schemas import BatchEpisodeOut, EpisodeSummary


def test_episode_summary_is_the_stored_part_of_the_batch_episode_row():
    # batch_summaries selects EpisodeSummary._fields as columns and the batch API answers each
    # row, meta_json left out, as a BatchEpisodeOut: its leading fields, same names, order and
    # types. The fields after them are the API's own (filled after the read), so they need a
    # default.
    stored = EpisodeSummary._fields[:-1]
    assert EpisodeSummary._fields[-1] == "meta_json"
    api = BatchEpisodeOut.model_fields
    assert tuple(api)[: len(stored)] == stored
    hints = typing.get_type_hints(EpisodeSummary)
    assert {n: hints[n] for n in stored} == {n: api[n].annotation for n in stored}
    assert hints["meta_json"] is str
    added = [n for n in api if n not in stored]
    assert all(api[n].default is not PydanticUndefined for n in added), added
