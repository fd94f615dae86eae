"""The compiler's side: the step compiled for a target (compiled), its HLO
collectives (hlo_collectives), the buffers live at its peak from the dumps
(xla_peak), symbolic vs compiled for a config or a kept row
(crosscheck), and one piece of a step's HBM bytes both ways
(bytes_probe)."""
