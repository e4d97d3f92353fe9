-- Stream destinations (NATS JetStream) beside webhook endpoints: the same rows, cursor,
-- lease and state, so one machinery delivers to both. A stream destination has no signing
-- secret (its secret is ''); its url is the broker's (nats://…).
ALTER TABLE plantstore_webhook_endpoints
    ADD COLUMN kind TEXT NOT NULL DEFAULT 'webhook' CHECK (kind IN ('webhook', 'nats')),
    ADD COLUMN stream TEXT,
    ADD COLUMN subject_prefix TEXT;

-- Per plant, the stream sequence JetStream gave the last message of that plant's subject,
-- and the stream position of the event it carried. The next message is published with
-- Nats-Expected-Last-Subject-Sequence = stream_seq, so a message stored but never recorded
-- here (a crash between the acknowledgement and the save) is found, not stored twice.
-- Written in the same transaction as the destination's cursor.
CREATE TABLE plantstore_stream_subjects (
    endpoint_id BIGINT NOT NULL REFERENCES plantstore_webhook_endpoints (id) ON DELETE CASCADE,
    plant_id    BIGINT NOT NULL,
    stream_seq  BIGINT NOT NULL,
    pos         BIGINT NOT NULL,
    kind        BIGINT NOT NULL,
    seq         BIGINT NOT NULL,
    PRIMARY KEY (endpoint_id, plant_id)
);
