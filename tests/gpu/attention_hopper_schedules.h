// @brief Every schedule of the sm90 attention pair, and their names, as the Hopper GPU tests run
// them: each test loops over these lists, so a new schedule is tested once it is listed here.
#pragma once

#include "kernels/attention_sm90/attention_sm90.h"

namespace cutrain::test::hopper_schedules {

namespace hopper = cutrain::kernels::sm90;

inline constexpr hopper::FwdTile kFwdTiles[] = {hopper::FwdTile::Rows128, hopper::FwdTile::Rows192};
inline constexpr hopper::BackwardSchedule kBackward[] = {
    hopper::BackwardSchedule::Lockstep, hopper::BackwardSchedule::Producer, hopper::BackwardSchedule::ProducerOverlap};
inline constexpr hopper::DqSchedule kDq[] = {hopper::DqSchedule::Serial, hopper::DqSchedule::Overlap};

inline const char* schedule_name(hopper::FwdTile t) {
  return t == hopper::FwdTile::Rows128 ? "forward rows128" : "forward rows192";
}
inline const char* schedule_name(hopper::BackwardSchedule s) {
  switch (s) {
    case hopper::BackwardSchedule::Lockstep: return "lockstep";
    case hopper::BackwardSchedule::Producer: return "producer";
    case hopper::BackwardSchedule::ProducerOverlap: return "producer_overlap";
  }
  return "?";
}
inline const char* schedule_name(hopper::DqSchedule s) {
  return s == hopper::DqSchedule::Serial ? "dq serial" : "dq overlap";
}

}  // namespace cutrain::test::hopper_schedules
