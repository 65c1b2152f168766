import { render, screen, within } from '@testing-library/react'
import { describe, expect, it } from 'vitest'
import { healthFixture } from '../test/fixtures'
import { HardwarePanel } from './HardwarePanel'

const GIB = 1024 ** 3

describe('HardwarePanel', () => {
  it('lists each worker with its device and memory in GiB', () => {
    render(<HardwarePanel state={{ health: healthFixture(), error: null, checkedAt: Date.now() }} />)
    const panel = screen.getByTestId('workers')
    const rows = within(panel).getAllByRole('row').slice(1)
    expect(rows).toHaveLength(2)
    expect(rows[0]).toHaveTextContent('gpu0@box')
    expect(rows[0]).toHaveTextContent('cuda:0 · NVIDIA H200')
    expect(rows[0]).toHaveTextContent('141.0 GiB')
    expect(rows[1]).toHaveTextContent('cpu · x86_64')
    expect(rows[1]).toHaveTextContent('24.0 GiB')
  })

  it('groups the workers by host, each host with its workers under it', () => {
    const worker = (name: string, host: string, index: number) => ({
      name: `${name}@${host}`,
      host,
      device: { kind: 'cuda' as const, name: 'NVIDIA H200', memory_total_bytes: 141 * GIB, index, host },
      last_seen: '2026-12-03T06:00:00Z',
    })
    const workers = [worker('gpu0', 'box-a', 0), worker('gpu1', 'box-a', 1), worker('gpu0', 'box-b', 0)]
    render(<HardwarePanel state={{ health: healthFixture({ workers }), error: null, checkedAt: Date.now() }} />)
    const panel = screen.getByTestId('workers')
    expect(panel).toHaveTextContent('2 hosts')
    const boxA = screen.getByTestId('host-box-a')
    expect(within(boxA).getByRole('rowheader')).toHaveTextContent('Host box-a · 2 workers')
    expect(within(boxA).getAllByRole('row').slice(1).map((row) => row.textContent)).toEqual([
      expect.stringContaining('gpu0@box-a'),
      expect.stringContaining('gpu1@box-a'),
    ])
    const boxB = screen.getByTestId('host-box-b')
    expect(within(boxB).getByRole('rowheader')).toHaveTextContent('Host box-b · 1 worker')
    expect(within(boxB).getAllByRole('row')).toHaveLength(2)
    expect(boxB).toHaveTextContent('gpu0@box-b')
  })

  it('says so when no worker is connected', () => {
    render(<HardwarePanel state={{ health: healthFixture({ workers: [] }), error: null, checkedAt: 0 }} />)
    expect(screen.getByTestId('workers')).toHaveTextContent('No workers connected')
  })
})
