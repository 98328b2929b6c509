-- Deliveries still to make on one channel (waiting for their time, or for the channel).
SELECT count(*) FROM deliveries WHERE channel = $1 AND status = 'pending'
