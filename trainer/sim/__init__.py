"""The training simulator: many copies of a CityLearn site stepped at once as numpy arrays.

CityLearn stays the judge (every evaluation, reference and figure in the report comes from it); this
package only makes training fast. ``site`` holds the physics, ``battery`` CityLearn's battery model.
"""
