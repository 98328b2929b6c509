SELECT calls FROM judge_spend WHERE watch = $1 AND day = $2
