"""A job's sampling options reach the engine's parameters as they were set, also after
the trip to a worker (dataclasses.asdict, JSON, Job.from_dict)."""

from __future__ import annotations

import dataclasses
import json

from chatapp.generation.jobs import Job, Options, sampling_params


def test_sampling_options_survive_the_trip_to_a_worker():
    from inference.loader import load_tokenizer

    options = Options(max_tokens=5, top_k=40, min_p=0.05, presence_penalty=0.5,
                      frequency_penalty=-1.0, repetition_penalty=1.2,
                      logit_bias=((50, -100.0), (7, 2.5)))
    job = Job(prompt_ids=(5, 6, 7), cache_salt="s", options=options)
    back = Job.from_dict(json.loads(json.dumps(dataclasses.asdict(job))))
    assert back == job and hash(back) == hash(job)
    params = sampling_params(back, max_model_len=100, tokenizer=load_tokenizer())
    assert (params.top_k, params.min_p, params.presence_penalty, params.frequency_penalty,
            params.repetition_penalty) == (40, 0.05, 0.5, -1.0, 1.2)
    assert params.logit_bias == {50: -100.0, 7: 2.5}
    params.validate()
