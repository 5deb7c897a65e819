"""The studies: the recipe study, the data-scaling curve and the schedule-shape study."""
