"""Every measurement below the labs: the side-by-side benchmark, the classroom load test, batched runs measured, and the timing and memory helpers they share."""
