-- Refunds made by an operator: one per payment, keyed refund:<payment id>
-- at the gateway so a repeated command never refunds twice.
CREATE TABLE refunds (
    payment_id         uuid        PRIMARY KEY,
    gateway_key        text        NOT NULL,
    charge_id          text        NOT NULL,
    gateway_refund_id  text        NOT NULL,
    amount_minor       bigint      NOT NULL CHECK (amount_minor > 0),
    requested_by       text        NOT NULL,
    created_at         timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE refunds IS 'Audit: refunds issued through the gateway by an operator.';
