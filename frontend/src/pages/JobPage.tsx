import { useMemo } from 'react'
import { useParams } from 'react-router'
import type uPlot from 'uplot'
import { LiveChart } from '../components/LiveChart'
import { PageHeader } from '../components/PageHeader'

const LOSS_SERIES = [
  { label: 'train loss', color: '#2f6fde' },
  { label: 'eval loss', color: '#d9822b' },
]
const THROUGHPUT_SERIES = [{ label: 'tokens/s', color: '#1f9d63' }]

export function JobPage() {
  const { id = '' } = useParams()
  // Empty until the job's event stream (WebSocket) is wired in.
  const lossData = useMemo<uPlot.AlignedData>(() => [[], [], []], [])
  const throughputData = useMemo<uPlot.AlignedData>(() => [[], []], [])

  return (
    <>
      <PageHeader
        title={`Job ${id}`}
        description="Live loss, throughput and GPU use of this job, its logs, and the artifacts it produced."
      />
      <div className="grid grid--two">
        <LiveChart title="Loss" data={lossData} series={LOSS_SERIES} />
        <LiveChart title="Throughput" data={throughputData} series={THROUGHPUT_SERIES} />
      </div>
    </>
  )
}
