"""``batchpipe serve``: the OpenAI Files + Batches API over Kafka (docs/api.md).

One concept per module: :mod:`.app` (the ASGI application and ``serve``), :mod:`.auth`
(API keys and owners), :mod:`.errors` (OpenAI error objects), :mod:`.records` (file and
batch records and their OpenAI shapes), :mod:`.state` (those records on a compacted Kafka
topic), :mod:`.store` and :mod:`.s3store` (file bytes), :mod:`.files` and :mod:`.batches`
(the routes), :mod:`.lifecycle` (a batch's progress and its ending) and :mod:`.assemble`
(output and error files from the results topic).
"""
